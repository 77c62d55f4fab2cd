"""The engine across processes: a run SIGKILLed between checkpoints and rerun ends bit for bit where
an uninterrupted run does; `torchrun --nproc_per_node 2` (gloo, DDP and FSDP) follows the loss curve
of one process with the same effective batch, and a bad input in one of its processes ends the run
with torchrun's summary naming that error."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from longdoc.cli import main
from longdoc.train import checkpoints
from tests.train import toy_task
from tests.train.test_engine import assert_same_weights, command
from tests.conftest import logged_losses

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("toy_tasks")]


def child_env(**extra) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


def toy_train_argv(argv: list[str]) -> list[str]:
    assert argv[:2] == ["train", "toy"]
    return argv[2:]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("no-dropout")
    return {
        "init": toy_task.make_init(folder / "init", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
        "train": toy_task.write_data(folder / "train.jsonl", 24, seed=1),
        "dev": toy_task.write_data(folder / "dev.jsonl", 4, seed=2),
    }


SETTINGS = {"max-steps": 3, "save-steps": 3, "keep-last": 2}


@pytest.fixture(scope="module")
def single(data, tmp_path_factory):
    """One process, 2 rows x 2 accumulated: the effective batch of 2 processes x 2 rows."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("single") / "out"
    assert main(command(data, out, **SETTINGS, **{"batch-size": 2, "grad-accum": 2})) == 0
    return out


@pytest.fixture
def dropout_data(tmp_path):
    return {
        "init": toy_task.make_init(tmp_path / "init-dropout"),
        "train": toy_task.write_data(tmp_path / "train.jsonl", 24, seed=1),
        "dev": toy_task.write_data(tmp_path / "dev.jsonl", 4, seed=2),
    }


def test_sigkill_between_checkpoints_then_rerun_is_exact(dropout_data, tmp_path, capsys):
    torch.set_num_threads(1)
    reference = tmp_path / "reference"
    assert main(command(dropout_data, reference)) == 0

    out, marker = tmp_path / "out", tmp_path / "reached"
    argv = [sys.executable, "-m", "tests.train.toy_train", *toy_train_argv(command(dropout_data, out))]
    # The 5th batch is step 5: after checkpoint step 4, before step 6.
    run = subprocess.Popen(argv, cwd=ROOT, env=child_env(LONGDOC_TOY_HANG_AT="5", LONGDOC_TOY_HANG_MARKER=str(marker)),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while not marker.exists():
        assert run.poll() is None, run.stderr.read().decode()
        assert time.monotonic() < deadline, "the training run never reached step 5"
        time.sleep(0.1)
    run.send_signal(signal.SIGKILL)
    run.wait()
    assert [path.name for path in checkpoints.list_checkpoints(out)] == ["step-000000002", "step-000000004"]
    assert not (out / "model.safetensors").exists()

    # Rerun in this process: what a resume reads is what the killed run left on disk.
    capsys.readouterr()
    assert main(command(dropout_data, out)) == 0
    stderr = capsys.readouterr().err
    assert "resuming from" in stderr and "step-000000004" in stderr
    assert_same_weights(load_file(out / "model.safetensors"), load_file(reference / "model.safetensors"))


@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_torchrun_two_processes_follow_one_process(data, single, tmp_path, sharding):
    out = tmp_path / "torchrun"
    argv = toy_train_argv(command(data, out, **SETTINGS, **{"batch-size": 2, "grad-accum": 1}))
    if sharding == "fsdp":
        argv.append("--fsdp")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "tests.train.toy_train", *argv],
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert logged_losses(out) == pytest.approx(logged_losses(single), rel=1e-5)
    assert len(logged_losses(out)) == 3
    assert [path.name for path in checkpoints.list_checkpoints(out)] == ["step-000000003"]
    trainer_state, _, state = checkpoints.read_checkpoint_files(checkpoints.list_checkpoints(out)[0])
    assert trainer_state["processes"] == 2 and len(state["rng"]) == 2
    model = toy_task.ToyModel.from_pretrained(out)
    single_weights = toy_task.ToyModel.from_pretrained(single).state_dict()
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, single_weights[name], rtol=1e-4, atol=1e-5)
    assert (out / "metrics.json").is_file()


def test_torchrun_two_processes_derive_accumulation_from_the_effective_batch(data, single, tmp_path):
    """The effective batch of `single` (2 rows x 2 passes) given as --effective-batch-size with 1 row
    per pass: each of 2 processes accumulates 2 passes, and the run follows the one-process run."""
    out = tmp_path / "torchrun"
    argv = toy_train_argv(command(data, out, **SETTINGS, **{"batch-size": 1, "effective-batch-size": 4}))
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "tests.train.toy_train", *argv],
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    resolved = json.loads((out / "train_options.json").read_text())
    assert (resolved["effective_batch_size"], resolved["grad_accum"]) == (4, 2)
    assert logged_losses(out) == pytest.approx(logged_losses(single), rel=1e-5)


def test_a_bad_input_in_one_torchrun_process_ends_the_run_and_torchrun_names_it(data, tmp_path):
    out = tmp_path / "torchrun"
    argv = toy_train_argv(command(data, out, **{"max-steps": 6, "save-steps": 2, "batch-size": 2}))
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "tests.train.toy_train", *argv], cwd=ROOT, capture_output=True, text=True,
                         env=child_env(LONGDOC_TOY_FAIL_AT="4", LONGDOC_TOY_FAIL_RANK="1"), timeout=300)
    error = "longdoc train: error: batch 4: a bad row (LONGDOC_TOY_FAIL_AT)"
    assert run.returncode != 0
    assert f"{error}\n" in run.stderr  # the process's own line
    assert f"traceback : {error}\n" in run.stderr  # torchrun's summary, from the error file it reads
    # What was saved before is whole; nothing of the steps after it.
    assert [path.name for path in checkpoints.list_checkpoints(out)] == ["step-000000002"]
    trainer_state, _, _ = checkpoints.read_checkpoint_files(checkpoints.list_checkpoints(out)[0])
    assert trainer_state["processes"] == 2
    assert not (out / "model.safetensors").exists() and not (out / "metrics.json").exists()
