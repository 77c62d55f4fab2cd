"""The engine in one process on the toy task: outputs, exact resume (from a checkpoint, after Ctrl-C,
past a corrupt checkpoint), a full disk while saving, and refusals of another task's or shape's --out."""

import errno
import json
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file

from longdoc.cli import main
from longdoc.evaluate.leaderboard import read_metrics_json
from longdoc.tasks import REGISTRY
from longdoc.train import checkpoints
from tests.train import toy_task

STEPS = 6
pytestmark = pytest.mark.usefixtures("toy_tasks")


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny models run many times faster on one thread than on two contended ones on a shared machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("toy")
    return {
        "init": toy_task.make_init(folder / "init"),
        "train": toy_task.write_data(folder / "train.jsonl", 40, seed=1),
        "dev": toy_task.write_data(folder / "dev.jsonl", 8, seed=2),
    }


def command(data, out, task="toy", **overrides):
    options = {"train": data["train"], "dev": data["dev"], "init": data["init"], "out": out, "batch-size": 4,
               "max-steps": STEPS, "save-steps": 2, "keep-last": 3, "lr": 1e-3, "log-steps": 1, **overrides}
    return ["train", task, *(item for name, value in options.items() for item in (f"--{name}", str(value)))]


def weights(out):
    return load_file(out / "model.safetensors")


def assert_same_weights(first, second):
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """An uninterrupted run."""
    out = tmp_path_factory.mktemp("reference") / "out"
    torch.set_num_threads(1)
    assert main(command(data, out, **{"eval-steps": 3})) == 0
    return out


def test_outputs_of_a_run(reference, data):
    assert [path.name for path in checkpoints.list_checkpoints(reference)] == [
        "step-000000002", "step-000000004", "step-000000006"]
    model = toy_task.ToyModel.from_pretrained(reference)
    assert model.config.task == "toy"
    record = read_metrics_json(reference / "metrics.json", REGISTRY)
    assert record.task == "toy" and set(record.metrics) == {"accuracy"}
    assert json.loads((reference / "dev_predictions.json").read_text()).keys() == {f"e{i}" for i in range(8)}
    assert (reference / "eval" / "step-000000003" / "dev_predictions.json").is_file()
    log = [json.loads(line) for line in (reference / "train_log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in log if "loss" in line] == list(range(1, STEPS + 1))
    assert [line["step"] for line in log if "eval" in line] == [3, STEPS]
    assert all(line["examples_per_second"] > 0 for line in log if "loss" in line)
    options = json.loads((reference / "train_options.json").read_text())
    assert options["batch_size"] == 4 and options["max_steps"] == STEPS and options["label_smoothing"] == 0.0
    assert (reference / "tokenizer.json").is_file()


def test_resume_from_a_checkpoint_is_exact(reference, data, tmp_path):
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(reference / "checkpoints" / "step-000000002", out / "checkpoints" / "step-000000002")
    assert main(command(data, out, **{"eval-steps": 3})) == 0
    assert_same_weights(weights(out), weights(reference))
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in log if "loss" in line] == [3, 4, 5, 6]


def test_ctrl_c_stops_with_a_checkpoint_then_resumes_exactly(reference, data, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    monkeypatch.setattr(toy_task, "collate", toy_task.collate_interrupting_at(3))  # during step 3
    assert main(command(data, out)) == 130
    assert "stopped at step 3 of 6" in capsys.readouterr().err
    assert [path.name for path in checkpoints.list_checkpoints(out)] == ["step-000000002", "step-000000003"]
    assert not (out / "model.safetensors").exists()
    monkeypatch.undo()
    assert main(command(data, out)) == 0
    assert_same_weights(weights(out), weights(reference))


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(reference, data, tmp_path):
    out = tmp_path / "out"
    for name in ("step-000000002", "step-000000004"):
        shutil.copytree(reference / "checkpoints" / name, out / "checkpoints" / name)
    broken = out / "checkpoints" / "step-000000004" / "model.safetensors"
    broken.write_bytes(broken.read_bytes()[:100])
    with pytest.warns(UserWarning, match=rf"checkpoint file {broken} is unreadable .*falling back"):
        assert main(command(data, out, **{"eval-steps": 3})) == 0
    assert_same_weights(weights(out), weights(reference))


def test_out_of_disk_while_saving_keeps_the_previous_checkpoint(data, tmp_path, monkeypatch, capsys):
    writes = []
    real_save = checkpoints.save_weights

    def save_until_disk_is_full(state_dict, path):
        writes.append(path)
        if len(writes) == 2:
            path.write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(state_dict, path)

    monkeypatch.setattr(checkpoints, "save_weights", save_until_disk_is_full)
    out = tmp_path / "out"
    assert main(command(data, out)) == 1
    error = capsys.readouterr().err
    first = out / "checkpoints" / "step-000000002"
    assert f"could not write checkpoint {out / 'checkpoints' / 'step-000000004'}: out of disk space" in error
    assert f"the previous checkpoint {first} is intact" in error
    assert [path.name for path in (out / "checkpoints").iterdir()] == ["step-000000002"]  # no temporary left
    trainer_state, _, _ = checkpoints.read_checkpoint_files(first)
    assert trainer_state["step"] == 2


def test_refuses_an_out_of_another_task_or_shape(reference, data, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(reference / "checkpoints" / "step-000000002", out / "checkpoints" / "step-000000002")
    assert main(command(data, out, task="toy-other")) == 2
    error = capsys.readouterr().err
    assert "holds a 'toy' checkpoint" in error and "not a 'toy-other' one" in error and "step-000000002" in error

    wider = toy_task.make_init(tmp_path / "wider", hidden_size=24)
    assert main(command(data, out, init=wider)) == 2
    error = capsys.readouterr().err
    assert "another model shape" in error and "hidden_size=16" in error and "hidden_size=24" in error

    assert main(command(data, reference, task="toy-other")) == 2  # a finished run: checkpoints and final model
    assert "holds a 'toy' checkpoint" in capsys.readouterr().err


def test_a_task_that_trains_another_tasks_model_reruns_on_its_finished_out(data, tmp_path):
    # "toy-alias" saves the "toy" model (config.json task "toy"): a finished run without
    # checkpoints left is its own, not another task's.
    out = tmp_path / "out"
    assert main(command(data, out, task="toy-alias", **{"max-steps": 2})) == 0
    assert json.loads((out / "config.json").read_text())["task"] == "toy"
    shutil.rmtree(out / "checkpoints")
    assert main(command(data, out, task="toy-alias", **{"max-steps": 2})) == 0


def test_too_few_rows_for_one_step(data, tmp_path, capsys):
    assert main(command(data, tmp_path / "out", **{"batch-size": 32, "grad-accum": 2})) == 2
    assert "40 training rows are fewer than one effective batch (32 x 2 x 1 processes = 64)" in capsys.readouterr().err


def test_gradient_checkpointing_trains_the_same(reference, data, tmp_path):
    out = tmp_path / "out"
    assert main([*command(data, out, **{"eval-steps": 3}), "--gradient-checkpointing"]) == 0
    first, second = weights(out), weights(reference)
    for name in first:  # recomputation replays the same dropout draws; sums may round differently
        torch.testing.assert_close(first[name], second[name], rtol=1e-5, atol=1e-6)


def test_encoder_switches_and_bf16_apply_to_the_run(data, tmp_path):
    out = tmp_path / "out"
    argv = [*command(data, out, **{"max-steps": 2, "long-max-len": 24}), "--no-residual-attention",
            "--talking-heads", "--bf16"]
    assert main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["residual_attention"] is False and config["talking_heads"] is True and config["long_max_len"] == 24
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert all(0 < line["loss"] < 10 for line in log if "loss" in line)


def test_rerun_after_the_end_only_evaluates_again(reference, data, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    before = (out / "train_log.jsonl").read_text()
    assert main(command(data, out, **{"eval-steps": 3})) == 0
    assert_same_weights(weights(out), weights(reference))
    assert (out / "train_log.jsonl").read_text() == before  # the final evaluation's line replaced, not repeated


def test_attention_runs_the_backend_named_for_this_run_only(data, reference, tmp_path, monkeypatch, capsys,
                                                          without_triton_interpreter):
    # --attention dense: the run computes its attention in the dense float64 reference (the same
    # training, within float32's rounding), and the model it saves keeps the --init encoder's backend.
    from longdoc.model.backends.dense import DenseBackend

    calls = []
    attend = DenseBackend.attend
    monkeypatch.setattr(DenseBackend, "attend", lambda self, operands: calls.append(1) or attend(self, operands))
    out = tmp_path / "out"
    assert main(command(data, out, attention="dense", **{"eval-steps": 3})) == 0
    assert calls
    assert json.loads((out / "config.json").read_text())["attention_backend"] == "auto"
    reference_weights, dense_weights = weights(reference), weights(out)
    for name in reference_weights:
        torch.testing.assert_close(dense_weights[name], reference_weights[name], atol=1e-4, rtol=1e-3, msg=name)
    capsys.readouterr()
    assert main(command(data, tmp_path / "gpu", attention="gpu")) == 2
    # (the line before it, when there is one, says the training rows came from the feature cache)
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("longdoc train: error: --attention gpu: attention backend 'gpu' cannot run on cpu in "
                            "float32: the GPU kernel runs on CUDA tensors only")
    assert not (tmp_path / "gpu").exists()  # refused before anything is written


def logged_scalars(out):
    """{tag: [(step, value), ...]} of the TensorBoard event files in out/runs, and of out/train_log.jsonl
    as --report-to tensorboard names them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "runs"))
    events.Reload()
    written = {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    expected = {}
    for line in map(json.loads, (out / "train_log.jsonl").read_text().splitlines()):
        group, values = ("eval", line["eval"]) if "eval" in line else ("train", line)
        for name, value in values.items():
            if name != "step":
                expected.setdefault(f"{group}/{name}", []).append((line["step"], value))
    return written, expected


def assert_same_scalars(written, expected):
    assert written.keys() == expected.keys()
    for tag, values in expected.items():
        assert [step for step, _ in written[tag]] == [step for step, _ in values], tag  # each step once
        # Event files hold float32.
        assert [value for _, value in written[tag]] == pytest.approx([value for _, value in values], rel=1e-6), tag


def test_report_to_tensorboard_logs_the_scalars_of_train_log(data, tmp_path):
    out = tmp_path / "out"
    assert main(command(data, out, **{"report-to": "tensorboard", "eval-steps": 3})) == 0
    written, expected = logged_scalars(out)
    assert set(expected) == {"train/loss", "train/lr", "train/examples_per_second", "train/epoch", "eval/accuracy"}
    assert_same_scalars(written, expected)
    assert [step for step, _ in written["train/loss"]] == list(range(1, STEPS + 1))
    assert [step for step, _ in written["eval/accuracy"]] == [3, STEPS]
    # Resumed from step 2: the events of steps 3 to 6 of the first run are hidden, as their log lines are dropped.
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    for name in ("step-000000004", "step-000000006", "model.safetensors"):
        path = resumed / "checkpoints" / name if name.startswith("step") else resumed / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    assert main(command(data, resumed, **{"report-to": "tensorboard", "eval-steps": 3})) == 0
    assert_same_scalars(*logged_scalars(resumed))
    assert [step for step, _ in logged_scalars(resumed)[0]["train/loss"]] == list(range(1, STEPS + 1))


@pytest.mark.parametrize("tool, message", [
    ("tensorboard", "--report-to tensorboard needs the tensorboard package: pip install 'longdoc[tensorboard]'"),
    ("wandb", "--report-to must be one of tensorboard, none, got 'wandb'"),
])
def test_report_to_refusals(data, tmp_path, monkeypatch, capsys, tool, message):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if the package were not installed
    assert main(command(data, tmp_path / "out", **{"report-to": tool})) == 2
    assert capsys.readouterr().err == f"longdoc train: error: {message}\n"
    assert not (tmp_path / "out").exists()


OUT_OF_MEMORY = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB"


def run_out_of_memory(monkeypatch, when):
    """ToyModel.forward raising torch's out-of-memory error on the calls for which `when(model, calls)`
    holds (calls: the number of calls so far); returns the shapes of the batches it was given."""
    shapes, real_forward = [], toy_task.ToyModel.forward

    def forward(self, labels=None, **inputs):
        shapes.append((*inputs["long_input_ids"].shape, inputs["global_input_ids"].shape[1]))
        if when(self, len(shapes)):
            raise torch.OutOfMemoryError(OUT_OF_MEMORY)
        return real_forward(self, labels, **inputs)

    monkeypatch.setattr(toy_task.ToyModel, "forward", forward)
    return shapes


def assert_one_line_error(capsys, expected: str) -> None:
    """The command (with --quiet: no progress bars) ended on the one line `expected`, its only error."""
    err = capsys.readouterr().err
    assert err.endswith(f"\n{expected}\n") or err == f"{expected}\n", err
    assert err.count("error") == 1 and "Traceback" not in err, err


def test_out_of_memory_in_a_training_step_is_one_line_and_keeps_whole_checkpoints(data, tmp_path, monkeypatch,
                                                                                   capsys):
    shapes = run_out_of_memory(monkeypatch, lambda model, calls: calls == 5)  # step 5, after step 4's checkpoint
    out = tmp_path / "out"
    assert main(["--quiet", *command(data, out, **{"eval-steps": 0})]) == 2
    rows, length, globals_ = shapes[-1]
    assert_one_line_error(capsys, (
        f"longdoc train: error: out of device memory training on a batch of {rows} rows of {length} long and "
        f"{globals_} global tokens: lower --batch-size (raise --grad-accum as much to keep the effective batch), lower "
        "--long-max-len, or turn on --gradient-checkpointing or --bf16"))
    assert rows == 4
    # The checkpoints written before are whole, nothing half-written beside them, no final model.
    assert sorted(path.name for path in (out / "checkpoints").iterdir()) == ["step-000000002", "step-000000004"]
    assert checkpoints.read_checkpoint_files(out / "checkpoints" / "step-000000004")[0]["step"] == 4
    assert not (out / "model.safetensors").exists()


def test_out_of_memory_while_evaluating_names_the_evaluation_batch(data, tmp_path, monkeypatch, capsys):
    shapes = run_out_of_memory(monkeypatch, lambda model, calls: not model.training)
    out = tmp_path / "out"
    assert main(["--quiet", *command(data, out, **{"eval-steps": 0, "eval-batch-size": 8})]) == 2
    rows, length, globals_ = shapes[-1]
    assert_one_line_error(capsys, (
        f"longdoc train: error: out of device memory evaluating on a batch of {rows} rows of {length} long and "
        f"{globals_} global tokens: lower --eval-batch-size (default: --batch-size)"))
    assert rows == 8
    # The last step's checkpoint comes before the evaluation, whole.
    assert checkpoints.read_checkpoint_files(out / "checkpoints" / f"step-{STEPS:09d}")[0]["step"] == STEPS
    assert not (out / "model.safetensors").exists()


def test_out_of_memory_while_predicting_is_one_line(reference, data, tmp_path, monkeypatch, capsys):
    shapes = run_out_of_memory(monkeypatch, lambda model, calls: True)
    prediction = tmp_path / "predictions.json"
    assert main(["--quiet", "predict", "toy", "--model", str(reference), "--data", str(data["dev"]), "--out", str(prediction),
                 "--batch-size", "3"]) == 2
    rows, length, globals_ = shapes[-1]
    assert_one_line_error(capsys, (
        f"longdoc predict: error: out of device memory predicting a batch of {rows} rows of {length} long and "
        f"{globals_} global tokens: lower --batch-size, or compute in bfloat16 (--bf16)"))
    assert rows == 3 and not prediction.exists()


def test_a_training_step_checks_each_batch_once(data, tmp_path, monkeypatch):
    # The values of a batch are read where it is collated, on the CPU; the encoder's forward, on the
    # CPU too, leaves them to that check instead of reading every input a second time.
    from longdoc.model import inputs
    from longdoc.model.pretrained import GlobalLocalModel

    checks, forwards = [], []
    check_values, forward = inputs._check_values, GlobalLocalModel.forward
    monkeypatch.setattr(inputs, "_check_values", lambda *args: checks.append(1) or check_values(*args))
    monkeypatch.setattr(GlobalLocalModel, "forward", lambda self, **batch: forwards.append(1) or forward(self, **batch))
    options = {"train": data["train"], "init": data["init"], "out": tmp_path / "out", "batch-size": 4,
               "grad-accum": 2, "max-steps": 2, "save-steps": 2, "lr": 1e-3}
    assert main(["--quiet", "train", "toy", *(item for name, value in options.items()
                                             for item in (f"--{name}", str(value)))]) == 0
    assert len(forwards) == 2 * 2  # steps x micro-batches, each one batch through the encoder
    assert len(checks) == len(forwards)
