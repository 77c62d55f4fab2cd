"""The shipped MiniLM, lifted once into the cache and reused, with no network access."""

import pytest

from longdoc import GlobalLocalModel
from longdoc.convert import lift as lift_module
from longdoc.convert import pretrained
from longdoc.convert.lift import LiftOptions


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def test_default_model_is_minilm_lifted_once_with_etc_base_options(cache, monkeypatch):
    path = pretrained.default_model_path()
    assert path.parent == cache / "lifted"
    config = GlobalLocalModel.from_pretrained(path).config
    assert (config.hidden_size, config.num_hidden_layers, config.position_embedding_type) == (384, 6, "relative")
    assert (config.local_radius, config.long_max_len, config.global_max_len) == (84, 4096, 256)
    assert (path / "README.md").is_file() and (path / "tokenizer.json").is_file()

    # Afterwards the cached copy is used: lifting again would fail this test.
    def no_second_lift(*args, **kwargs):
        raise AssertionError("lifted twice")

    monkeypatch.setattr(lift_module, "lift", no_second_lift)
    assert pretrained.lifted_minilm(**vars(LiftOptions())) == path
    assert pretrained.default_model_path() == path


def test_other_options_get_another_cache_folder(cache):
    default = pretrained.lifted_minilm_folder(LiftOptions())
    assert pretrained.lifted_minilm_folder(LiftOptions()) == default
    assert pretrained.lifted_minilm_folder(LiftOptions(positions="both")) != default
    assert pretrained.lifted_minilm_folder(LiftOptions(local_radius=64)) != default
    assert default.parent == cache / "lifted"
