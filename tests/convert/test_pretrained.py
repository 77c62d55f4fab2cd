"""The shipped MiniLM, lifted once into the cache and reused, with no network access."""

from pathlib import Path

import pytest

from longdoc import GlobalLocalModel
from longdoc.convert import lift as lift_module
from longdoc.convert import pretrained
from longdoc.convert.lift import LiftOptions
from longdoc.train.options import TrainingOptions


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


@pytest.mark.slow  # lifts the real MiniLM into a fresh cache
def test_default_model_is_minilm_lifted_once_with_tiled_absolute_positions(cache, monkeypatch):
    path = pretrained.default_model_path()
    assert path.parent == cache / "lifted"
    config = GlobalLocalModel.from_pretrained(path).config
    assert (config.hidden_size, config.num_hidden_layers, config.position_embedding_type) == (384, 6, "absolute")
    assert (config.local_radius, config.long_max_len, config.global_max_len) == (84, 4096, 256)
    assert config.max_position_embeddings == 4096 and config.residual_attention
    assert (path / "README.md").is_file() and (path / "tokenizer.json").is_file()

    # Afterwards the cached copy is used: lifting again would fail this test.
    def no_second_lift(*args, **kwargs):
        raise AssertionError("lifted twice")

    monkeypatch.setattr(lift_module, "lift", no_second_lift)
    assert pretrained.lifted_minilm(positions="absolute") == path
    assert pretrained.default_model_path() == path
    assert pretrained.initial_weights(TrainingOptions(train=Path("train.json"), out=Path("out"))) == path


def test_default_lift_is_etc_base_with_absolute_positions_in_its_own_folder(cache):
    default = pretrained.lifted_minilm_folder(LiftOptions(positions=pretrained.DEFAULT_POSITIONS))
    assert pretrained.DEFAULT_POSITIONS == "absolute"
    assert default.name.startswith("all-minilm-l6-v2-absolute-")
    relative = pretrained.lifted_minilm_folder(LiftOptions(positions="relative"))
    assert relative.name.startswith("all-minilm-l6-v2-relative-") and relative != default


def test_init_positions_picks_the_lift_and_init_wins(cache, monkeypatch):
    lifted = []
    monkeypatch.setattr(pretrained, "lifted_minilm", lambda **options: lifted.append(options) or cache / "x")
    required = {"train": Path("train.json"), "out": Path("out")}
    pretrained.initial_weights(TrainingOptions(**required, init_positions="relative"))
    pretrained.initial_weights(TrainingOptions(**required))
    assert lifted == [{"positions": "relative"}, {"positions": "absolute"}]
    assert pretrained.initial_weights(TrainingOptions(**required, init=Path("my/encoder"))) == Path("my/encoder")
    assert len(lifted) == 2


def test_every_option_and_the_lift_format_get_their_own_cache_folder(cache, monkeypatch):
    default = pretrained.lifted_minilm_folder(LiftOptions())
    assert default.parent == cache / "lifted"
    # Each option changes the lifted weights or config, so each must change the folder.
    changed = {"positions": "both", "residual_attention": False, "talking_heads": True, "local_radius": 64,
               "long_max_len": 2048, "global_max_len": 128, "share_qkv": True, "share_attention_output": True,
               "share_feed_forward": True, "seed": 1}
    assert set(changed) == set(vars(LiftOptions()))  # a new option must be added here
    folders = {pretrained.lifted_minilm_folder(LiftOptions(**{name: value})) for name, value in changed.items()}
    assert len(folders) == len(changed) and default not in folders
    # A change in what lifting means leaves old cached copies unused.
    monkeypatch.setattr(lift_module, "LIFT_FORMAT_VERSION", lift_module.LIFT_FORMAT_VERSION + 1)
    assert pretrained.lifted_minilm_folder(LiftOptions()) != default
