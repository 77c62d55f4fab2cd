"""Training options: defaults < --config file < command line; bad config files refused by name."""

from pathlib import Path

import pytest

from longdoc.cli import main
from longdoc.errors import InputError
from longdoc.train.options import ENGINE_OPTIONS, TrainOption, accumulation_for, resolve_options

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


@pytest.mark.parametrize("world_size, accumulation", [(1, 32), (2, 16), (8, 4)])
def test_effective_batch_gives_each_process_its_accumulation(world_size, accumulation):
    assert accumulation_for(64, 2, world_size) == accumulation
    resolved = resolve_options({**REQUIRED, "batch_size": 2, "effective_batch_size": 64}, OPTIONS,
                               world_size=world_size)
    assert resolved["grad_accum"] == accumulation
    assert resolved["batch_size"] * resolved["grad_accum"] * world_size == 64


def test_effective_batch_is_read_from_torchruns_world_size(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert resolve_options({**REQUIRED, "batch_size": 1, "effective_batch_size": 32}, OPTIONS)["grad_accum"] == 4
    monkeypatch.delenv("WORLD_SIZE")
    assert resolve_options({**REQUIRED, "batch_size": 1, "effective_batch_size": 32}, OPTIONS)["grad_accum"] == 32


def test_without_effective_batch_grad_accum_stays_per_process():
    resolved = resolve_options({**REQUIRED, "batch_size": 2, "grad_accum": 3}, OPTIONS, world_size=8)
    assert resolved["grad_accum"] == 3 and resolved["effective_batch_size"] is None


def test_effective_batch_not_divisible_names_the_numbers_and_flags():
    with pytest.raises(InputError, match=r"--effective-batch-size 32 is not a multiple of --batch-size 3 x 2 "
                                         r"processes = 6: change --batch-size, the number of processes or "
                                         r"--effective-batch-size"):
        resolve_options({**REQUIRED, "batch_size": 3, "effective_batch_size": 32}, OPTIONS, world_size=2)
    # Fewer rows than one pass on every process is no batch either.
    with pytest.raises(InputError, match=r"--effective-batch-size 8 is not a multiple of --batch-size 2 x 8 "
                                         r"processes = 16"):
        accumulation_for(8, 2, 8)
    with pytest.raises(InputError, match=r"--effective-batch-size must be >= 1, got 0"):
        resolve_options({**REQUIRED, "effective_batch_size": 0}, OPTIONS)


def test_grad_accum_and_effective_batch_must_agree_when_both_are_set(tmp_path):
    config = tmp_path / "run.json"
    config.write_text('{"batch_size": 1, "effective_batch_size": 32}')
    with pytest.raises(InputError, match=r"--grad-accum 8 and --effective-batch-size 32 disagree: --batch-size 1 "
                                         r"x 2 processes x --grad-accum 8 = 16 rows per step; give one of them"):
        resolve_options({**REQUIRED, "grad_accum": 8}, OPTIONS, config, world_size=2)
    assert resolve_options({**REQUIRED, "grad_accum": 16}, OPTIONS, config, world_size=2)["grad_accum"] == 16


@pytest.mark.parametrize("task", ["hotpotqa", "nq", "openkp", "wikihop"])
def test_published_configs_state_the_papers_batch_for_any_process_count(task):
    from longdoc.tasks import get_task

    shipped = get_task(task).configs
    papers_batch = {"hotpotqa": 32, "nq": 64, "openkp": 64, "wikihop": 32}[task]
    for world_size in (1, 2, 8):
        resolved = resolve_options(REQUIRED, (*ENGINE_OPTIONS, *get_task(task).train_options), "published", shipped,
                                   world_size=world_size)
        assert resolved["effective_batch_size"] == papers_batch
        assert resolved["batch_size"] * resolved["grad_accum"] * world_size == papers_batch


def test_init_positions_is_checked_and_only_applies_without_init():
    assert resolve_options({**REQUIRED, "init_positions": "relative"}, OPTIONS)["init_positions"] == "relative"
    with pytest.raises(InputError, match=r"--init-positions must be one of relative, absolute, both, got 'tiled'"):
        resolve_options({**REQUIRED, "init_positions": "tiled"}, OPTIONS)
    with pytest.raises(InputError, match=r"--init-positions chooses the lift of the packaged MiniLM; it does not "
                                         r"apply with --init lifted"):
        resolve_options({**REQUIRED, "init_positions": "relative", "init": Path("lifted")}, OPTIONS)
