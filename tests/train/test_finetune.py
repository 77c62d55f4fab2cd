"""`longdoc train TASK` builds its training rows once: a second run on the same file, tokenizer and
settings reads them from the feature cache (and says so), and trains bit for bit as the first did;
a changed option builds them again (the toy task, tests/train/toy_task.py)."""


import pytest
import torch
from safetensors.torch import load_file

from longdoc.cli import main
from longdoc.train import finetune
from tests.train import toy_task
from tests.conftest import logged_losses

pytestmark = pytest.mark.usefixtures("toy_tasks")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(finetune, "feature_cache_folder", lambda: tmp_path / "features")
    return tmp_path / "features"


def command(folder, out, **overrides):
    options = {"train": folder / "train.jsonl", "init": folder / "init", "out": out, "batch-size": 4,
               "max-steps": 3, "lr": 1e-3, "log-steps": 1, "seed": 0, **overrides}
    return ["train", "toy", *(item for name, value in options.items() for item in (f"--{name}", str(value)))]


def test_a_second_run_reads_its_rows_from_the_cache_and_trains_the_same(tmp_path, cache, capsys):
    toy_task.make_init(tmp_path / "init")
    toy_task.write_data(tmp_path / "train.jsonl", 24, seed=1)
    torch.set_num_threads(1)
    assert main(command(tmp_path, tmp_path / "first")) == 0
    assert "24 training rows built in" in capsys.readouterr().err
    assert main(command(tmp_path, tmp_path / "second")) == 0
    assert f"24 training rows from the feature cache ({cache}/" in capsys.readouterr().err
    first, second = load_file(tmp_path / "first" / "model.safetensors"), load_file(tmp_path / "second" /
                                                                                  "model.safetensors")
    assert first.keys() == second.keys() and all(torch.equal(first[name], second[name]) for name in first)
    assert logged_losses(tmp_path / "first") == logged_losses(tmp_path / "second")
    assert len(logged_losses(tmp_path / "first")) == 3

    assert main(command(tmp_path, tmp_path / "third", **{"long-max-len": 16})) == 0  # another window length
    assert "24 training rows built in" in capsys.readouterr().err
    assert len(list(cache.iterdir())) == 2


def test_with_quiet_the_feature_cache_says_nothing(tmp_path, cache, capsys):
    toy_task.make_init(tmp_path / "init")
    toy_task.write_data(tmp_path / "train.jsonl", 24, seed=1)
    torch.set_num_threads(1)
    for out in ("first", "second"):  # (the rows built, then read from the cache)
        assert main(["--quiet", *command(tmp_path, tmp_path / out)]) == 0
        assert "training rows" not in capsys.readouterr().err
    assert len(list(cache.iterdir())) == 1
