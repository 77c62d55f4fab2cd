"""Training options: defaults < --config file < command line, as typed records; bad config files
refused by name; errors name the options by field (the command line shows its flags)."""

import dataclasses
import json
from pathlib import Path

import pytest

from longdoc.cli import main
from longdoc.commands.hints import with_hint
from longdoc.data.windows import StrideOption
from longdoc.errors import InputError, OptionError
from longdoc.train.options import (
    ENGINE_OPTIONS, PretrainingOptions, TrainingOptions, accumulation_for, recorded_options, resolve_options,
)

OPTIONS = (TrainingOptions, StrideOption)  # the engine's record and a task's
REQUIRED = {"train": Path("train.jsonl"), "out": Path("out")}


def resolved(given, config=None, shipped=None, world_size=None) -> dict:
    """The options of both records, by name."""
    engine, task = resolve_options(given, OPTIONS, config, shipped, world_size)
    return {**dataclasses.asdict(engine), **dataclasses.asdict(task)}


def test_defaults_config_then_command_line(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("batch_size: 4\nlr: 3e-5\ngrad-accum: 2\nstride: 64\ngradient_checkpointing: true\n")
    engine, task = resolve_options({**REQUIRED, "batch_size": 16, "lr": None}, OPTIONS, config)
    assert engine.batch_size == 16  # command line over the file
    assert engine.lr == 3e-5 and isinstance(engine.lr, float)  # YAML 1.1 reads 3e-5 as text
    assert engine.grad_accum == 2 and task.stride == 64 and engine.gradient_checkpointing is True
    assert engine.seed == 42 and engine.config == str(config)
    # train_options.json: every option by name (the task's after the engine's), then the config file
    recorded = recorded_options(engine, task)
    assert list(recorded)[-2:] == ["stride", "config"] and recorded["train"] == "train.jsonl"
    assert json.loads(json.dumps(recorded)) == recorded


def test_json_config_and_shipped_name(tmp_path):
    shipped = tmp_path / "configs"
    shipped.mkdir()
    (shipped / "cpu.json").write_text('{"max_steps": 7, "train": "data/train.jsonl", "out": "runs/x"}')
    options = resolved({}, "cpu", shipped)
    assert options["max_steps"] == 7 and options["train"] == Path("data/train.jsonl")
    with pytest.raises(OptionError, match=r"config gpu: no such file; shipped configs: cpu"):
        resolved({}, "gpu", shipped)


@pytest.mark.parametrize("suffix, text", [(".json", '{"batch_size": 4, "learning_rate": 1e-4}'),
                                          (".yaml", "batch_size: 4\nlearning_rate: 1.0e-4\n")])
def test_unknown_option_in_config_names_option_and_file(tmp_path, suffix, text):
    config = tmp_path / f"run{suffix}"
    config.write_text(text)
    with pytest.raises(InputError, match=rf"{config}: unknown option 'learning_rate'"):
        resolved(REQUIRED, config)


def test_wrong_types_and_values_refused(tmp_path):
    config = tmp_path / "run.json"
    config.write_text('{"batch_size": "four"}')
    with pytest.raises(InputError, match=r"run.json: option 'batch_size' must be int, got 'four'"):
        resolved(REQUIRED, config)
    with pytest.raises(OptionError, match=r"^grad_accum must be >= 1, got 0") as refused:
        resolved({**REQUIRED, "grad_accum": 0})
    assert with_hint(refused.value) == "--grad-accum must be >= 1, got 0"
    with pytest.raises(OptionError, match=r"^out is required") as refused:
        resolved({"train": Path("t")})
    assert with_hint(refused.value) == "--out is required (on the command line or in the --config file)"
    with pytest.raises(OptionError, match=r"^lr must be > 0, got -1"):
        TrainingOptions(**REQUIRED, lr=-1)


def test_command_refuses_unknown_config_option_with_exit_2(tmp_path, capsys):
    config = tmp_path / "bad.json"
    config.write_text('{"batch_size": 2, "warmup_steps": 10}')
    assert main(["train", "hotpotqa", "--config", str(config), "--train", "x", "--out", str(tmp_path)]) == 2
    assert f"{config}: unknown option 'warmup_steps'" in capsys.readouterr().err


@pytest.mark.parametrize("world_size, accumulation", [(1, 32), (2, 16), (8, 4)])
def test_effective_batch_gives_each_process_its_accumulation(world_size, accumulation):
    assert accumulation_for(64, 2, world_size) == accumulation
    options = resolved({**REQUIRED, "batch_size": 2, "effective_batch_size": 64}, world_size=world_size)
    assert options["grad_accum"] == accumulation
    assert options["batch_size"] * options["grad_accum"] * world_size == 64


def test_effective_batch_is_read_from_torchruns_world_size(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert resolved({**REQUIRED, "batch_size": 1, "effective_batch_size": 32})["grad_accum"] == 4
    monkeypatch.delenv("WORLD_SIZE")
    assert resolved({**REQUIRED, "batch_size": 1, "effective_batch_size": 32})["grad_accum"] == 32


def test_without_effective_batch_grad_accum_stays_per_process():
    options = resolved({**REQUIRED, "batch_size": 2, "grad_accum": 3}, world_size=8)
    assert options["grad_accum"] == 3 and options["effective_batch_size"] is None


def test_effective_batch_not_divisible_names_the_numbers_and_options():
    with pytest.raises(OptionError, match=r"effective_batch_size 32 is not a multiple of batch_size 3 x 2 "
                                          r"processes = 6: change batch_size, the number of processes or "
                                          r"effective_batch_size") as refused:
        resolved({**REQUIRED, "batch_size": 3, "effective_batch_size": 32}, world_size=2)
    assert with_hint(refused.value) == ("--effective-batch-size 32 is not a multiple of --batch-size 3 x 2 processes "
                                        "= 6: change --batch-size, the number of processes or --effective-batch-size")
    # Fewer rows than one pass on every process is no batch either.
    with pytest.raises(OptionError, match=r"effective_batch_size 8 is not a multiple of batch_size 2 x 8 "
                                          r"processes = 16"):
        accumulation_for(8, 2, 8)
    with pytest.raises(OptionError, match=r"effective_batch_size must be >= 1, got 0"):
        resolved({**REQUIRED, "effective_batch_size": 0})


def test_grad_accum_and_effective_batch_must_agree_when_both_are_set(tmp_path):
    config = tmp_path / "run.json"
    config.write_text('{"batch_size": 1, "effective_batch_size": 32}')
    with pytest.raises(OptionError, match=r"grad_accum 8 and effective_batch_size 32 disagree: batch_size 1 "
                                          r"x 2 processes x grad_accum 8 = 16 rows per step; give one of them"):
        resolved({**REQUIRED, "grad_accum": 8}, config, world_size=2)
    assert resolved({**REQUIRED, "grad_accum": 16}, config, world_size=2)["grad_accum"] == 16


@pytest.mark.parametrize("task", ["hotpotqa", "nq", "openkp", "wikihop"])
def test_published_configs_state_the_papers_batch_for_any_process_count(task):
    from longdoc.tasks import get_task
    from longdoc.train.options import resolve_task_options

    papers_batch = {"hotpotqa": 32, "nq": 64, "openkp": 64, "wikihop": 32}[task]
    for world_size in (1, 2, 8):
        options, _ = resolve_task_options(get_task(task), REQUIRED, "published", world_size=world_size)
        assert options.effective_batch_size == papers_batch
        assert options.batch_size * options.grad_accum * world_size == papers_batch


def test_init_positions_is_checked_and_only_applies_without_init():
    assert resolved({**REQUIRED, "init_positions": "relative"})["init_positions"] == "relative"
    with pytest.raises(OptionError, match=r"init_positions must be one of relative, absolute, both, got 'tiled'"):
        resolved({**REQUIRED, "init_positions": "tiled"})
    with pytest.raises(OptionError, match=r"init_positions chooses the lift of the packaged MiniLM; it does not "
                                          r"apply with init lifted"):
        resolved({**REQUIRED, "init_positions": "relative", "init": Path("lifted")})


def test_the_records_declare_each_option_once_with_its_type():
    names = [option.name for option in ENGINE_OPTIONS]
    assert len(names) == len(set(names)) and "config" not in names
    by_name = {option.name: option for option in ENGINE_OPTIONS}
    assert (by_name["lr"].type, by_name["lr"].default, by_name["lr"].metavar) == (float, 5e-5, "X")
    assert (by_name["init"].type, by_name["bf16"].type) == (Path, bool)
    # pretraining extends the engine's record: its fields come after the engine's
    assert [option.name for option in ENGINE_OPTIONS] == [field.name for field in
                                                         dataclasses.fields(PretrainingOptions)][:len(names)]
