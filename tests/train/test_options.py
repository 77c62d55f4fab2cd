"""Training options: defaults < --config file < command line; bad config files refused by name."""

from pathlib import Path

import pytest

from longdoc.cli import main
from longdoc.errors import InputError
from longdoc.train.options import ENGINE_OPTIONS, TrainOption, resolve_options

TASK_OPTION = TrainOption("stride", int, 128, "task option")
OPTIONS = (*ENGINE_OPTIONS, TASK_OPTION)
REQUIRED = {"train": Path("train.jsonl"), "out": Path("out")}


def test_defaults_config_then_command_line(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("batch_size: 4\nlr: 3e-5\ngrad-accum: 2\nstride: 64\ngradient_checkpointing: true\n")
    resolved = resolve_options({**REQUIRED, "batch_size": 16, "lr": None}, OPTIONS, config)
    assert resolved["batch_size"] == 16  # command line over the file
    assert resolved["lr"] == 3e-5 and isinstance(resolved["lr"], float)  # YAML 1.1 reads 3e-5 as text
    assert resolved["grad_accum"] == 2 and resolved["stride"] == 64 and resolved["gradient_checkpointing"] is True
    assert resolved["seed"] == 42 and resolved["config"] == str(config)


def test_json_config_and_shipped_name(tmp_path):
    shipped = tmp_path / "configs"
    shipped.mkdir()
    (shipped / "cpu.json").write_text('{"max_steps": 7, "train": "data/train.jsonl", "out": "runs/x"}')
    resolved = resolve_options({}, OPTIONS, "cpu", shipped)
    assert resolved["max_steps"] == 7 and resolved["train"] == Path("data/train.jsonl")
    with pytest.raises(InputError, match=r"--config gpu: no such file; shipped configs: cpu"):
        resolve_options({}, OPTIONS, "gpu", shipped)


@pytest.mark.parametrize("suffix, text", [(".json", '{"batch_size": 4, "learning_rate": 1e-4}'),
                                          (".yaml", "batch_size: 4\nlearning_rate: 1.0e-4\n")])
def test_unknown_option_in_config_names_option_and_file(tmp_path, suffix, text):
    config = tmp_path / f"run{suffix}"
    config.write_text(text)
    with pytest.raises(InputError, match=rf"{config}: unknown option 'learning_rate'"):
        resolve_options(REQUIRED, OPTIONS, config)


def test_wrong_types_and_values_refused(tmp_path):
    config = tmp_path / "run.json"
    config.write_text('{"batch_size": "four"}')
    with pytest.raises(InputError, match=r"run.json: option 'batch_size' must be int, got 'four'"):
        resolve_options(REQUIRED, OPTIONS, config)
    with pytest.raises(InputError, match=r"--grad-accum must be >= 1, got 0"):
        resolve_options({**REQUIRED, "grad_accum": 0}, OPTIONS)
    with pytest.raises(InputError, match=r"--out is required"):
        resolve_options({"train": Path("t")}, OPTIONS)


def test_command_refuses_unknown_config_option_with_exit_2(tmp_path, capsys):
    config = tmp_path / "bad.json"
    config.write_text('{"batch_size": 2, "warmup_steps": 10}')
    assert main(["train", "hotpotqa", "--config", str(config), "--train", "x", "--out", str(tmp_path)]) == 2
    assert f"{config}: unknown option 'warmup_steps'" in capsys.readouterr().err
