"""`torchrun --nproc_per_node 2 longdoc predict` (gloo, one thread each) on the real samples
(../shared/data): the official prediction file and its scores side file are byte-identical to one
process's, for every task; a run whose process is SIGKILLed halfway, rerun (with 2 processes or 1),
reuses what was saved, says so, shows one progress bar and ends byte-identical; Ctrl-C says what is
kept; bad data stops every process with one line and writes nothing, also when only one process
meets the bad example; processes given different --data or --out are refused before anything runs,
as are the saved outputs of another run and a shards folder the processes, or one of them, cannot
write."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from longdoc.cli import main
from longdoc.convert.pretrained import default_tokenizer
from longdoc.data.shared_prediction import PredictionRun, model_fingerprint, sha256_of_data, shards_folder
from longdoc.tasks import get_task
from tests.tasks.conftest import TINY_ENCODER, write_encoder
from tests.tasks.predictions import HOTPOTQA_GOLD, NQ_GOLD, OPENKP_GOLD, WIKIHOP_GOLD

ROOT = Path(__file__).resolve().parents[2]
DATA = {"hotpotqa": HOTPOTQA_GOLD, "wikihop": WIKIHOP_GOLD, "nq": NQ_GOLD, "openkp": OPENKP_GOLD}
ENCODER = dict(TINY_ENCODER, global_max_len=128, long_max_len=256)
pytestmark = pytest.mark.slow
# The killed run's data: the HotpotQA sample's first questions, and the windows they take at 256 long tokens.
KILLED_EXAMPLES, KILLED_WINDOWS = 24, 288


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A model folder per task: the tiny encoder (seed 0) with fresh heads (seed 0); scores mean nothing."""
    root = tmp_path_factory.mktemp("models")
    tokenizer = default_tokenizer()
    encoder = write_encoder(root / "encoder", tokenizer, **ENCODER)
    for name in DATA:
        torch.manual_seed(0)
        get_task(name).load("model").from_encoder(encoder).save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def predict_argv(task: str, model: Path, data: Path, out: Path, batch_size: int = 2) -> list[str]:
    return ["--quiet", "predict", task, "--model", str(model), "--data", str(data), "--out", str(out),
            "--batch-size", str(batch_size)]


def torchrun(processes: int, argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
            "-m", "longdoc.cli", *argv]


def torchrun_per_process(first: str, second: str, argv: list[str]) -> subprocess.CompletedProcess:
    """`longdoc` with `argv` in 2 torchrun processes, process 0 after the shell commands `first`,
    process 1 after `second` (what differs between machines: a folder, a variable in argv)."""
    script = (f'if [ "$RANK" = 0 ]; then {first}; else {second}; fi; '
              f'exec {sys.executable} -m longdoc.cli {" ".join(argv)}')
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "--no-python", "sh", "-c", script], cwd=ROOT, env=child_env(), capture_output=True,
                          text=True, timeout=300)


def child_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def one_process(argv: list[str]) -> None:
    torch.set_num_threads(1)
    assert main(argv) == 0


def assert_same_files(one: Path, two: Path) -> None:
    assert two.read_bytes() == one.read_bytes()
    scores = one.with_name(one.name + ".scores.jsonl")
    if scores.exists():  # NQ's official file holds its scores
        assert two.with_name(two.name + ".scores.jsonl").read_bytes() == scores.read_bytes()
    assert not shards_folder(two).exists()


def assert_every_process_ended_with(run: subprocess.CompletedProcess, error: str) -> None:
    """The run ended (torchrun stops every process once one fails) with `error`, one line, as the
    status-2 exit of a process, which torchrun's summary names. Both processes meet the error (the
    same data, the same check); the second may be stopped by torchrun before it says so."""
    assert run.returncode != 0
    assert error in run.stderr, run.stderr[-3000:]
    assert "exitcode  : 2 " in run.stderr
    assert f"traceback : {error}\n" in run.stderr


@pytest.mark.parametrize("task", sorted(DATA))
def test_two_processes_write_the_files_of_one(models, shared_data, tmp_path, task):
    data = shared_data / DATA[task]
    (tmp_path / "one").mkdir(), (tmp_path / "two").mkdir()
    one_process(predict_argv(task, models / task, data, tmp_path / "one" / "pred.json"))
    run = subprocess.run(torchrun(2, [*predict_argv(task, models / task, data, tmp_path / "two" / "pred.json"),
                                      "--json"]), cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert_same_files(tmp_path / "one" / "pred.json", tmp_path / "two" / "pred.json")
    assert run.stderr.count("wrote ") == 1  # the main process tells, once
    (summary,) = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(summary["processes"]) == 2
    assert sum(share["examples"] for share in summary["processes"]) == summary["examples"]
    assert sum(share["windows"] for share in summary["processes"]) == summary["windows"]


def _workers(parent: int) -> list[int]:
    """The processes torchrun started (its children), by pid."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [int(pid) for pid in children]


def test_a_process_killed_halfway_then_the_same_command_reuses_and_ends_byte_identical(models, shared_data, tmp_path):
    # The sample's first 24 questions: four runs of them (one uninterrupted, one killed, two resumed).
    data = tmp_path / "hotpotqa.json"
    data.write_text(json.dumps(json.loads((shared_data / HOTPOTQA_GOLD).read_text())[:KILLED_EXAMPLES]))
    (tmp_path / "one").mkdir(), (tmp_path / "two").mkdir()
    one_process(predict_argv("hotpotqa", models / "hotpotqa", data, tmp_path / "one" / "pred.json", batch_size=1))
    out = tmp_path / "two" / "pred.json"
    argv = predict_argv("hotpotqa", models / "hotpotqa", data, out, batch_size=1)
    run = subprocess.Popen(torchrun(2, argv), cwd=ROOT, env=child_env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while len(list(shards_folder(out).glob("*.pt"))) < 8:  # of 24 examples, one per pack at batch size 1
        assert run.poll() is None, run.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(_workers(run.pid)[-1], signal.SIGKILL)
    assert run.wait(timeout=120) != 0
    assert not out.exists()
    saved = len(list(shards_folder(out).glob("*.pt")))
    assert saved < KILLED_EXAMPLES
    shutil.copytree(out.parent, tmp_path / "killed", symlinks=True)  # the folder as the kill left it

    # Resumed by 2 processes, then (from the folder as the kill left it again) by 1, with its progress
    # bar shown: one bar, the main process's, counting every process's work.
    for resumed_with in (2, 1):
        if resumed_with == 1:
            shutil.rmtree(out.parent)
            shutil.copytree(tmp_path / "killed", out.parent, symlinks=True)
        rerun = subprocess.run(torchrun(resumed_with, argv[1:]), cwd=ROOT, env=child_env(), capture_output=True,
                               text=True, timeout=300)
        assert rerun.returncode == 0, (resumed_with, rerun.stderr[-3000:])
        assert f"reused {saved} of {KILLED_EXAMPLES} examples (" in rerun.stderr, resumed_with
        assert f" of {KILLED_WINDOWS} windows) predicted by an interrupted run" in rerun.stderr, resumed_with
        assert rerun.stderr.count("predict:   0%") == 1, resumed_with
        assert f"{KILLED_EXAMPLES}/{KILLED_EXAMPLES}" in rerun.stderr, resumed_with
        assert f"{KILLED_WINDOWS} windows" in rerun.stderr, resumed_with
        assert_same_files(tmp_path / "one" / "pred.json", out)


def test_ctrl_c_says_the_saved_predictions_are_kept(models, shared_data, tmp_path):
    out = tmp_path / "pred.json"
    argv = predict_argv("hotpotqa", models / "hotpotqa", shared_data / HOTPOTQA_GOLD, out, batch_size=1)
    run = subprocess.Popen(torchrun(2, argv), cwd=ROOT, env=child_env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 180
    while len(list(shards_folder(out).glob("*.pt"))) < 10:
        assert run.poll() is None, run.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: torchrun and its processes
    stderr = run.communicate(timeout=120)[1]
    assert run.returncode != 0
    assert (f"longdoc predict: interrupted; the predictions completed so far are kept in {shards_folder(out)}; "
            "the same command continues from them") in stderr, stderr[-3000:]
    assert "Traceback" not in stderr.split("longdoc predict: interrupted")[0]
    assert not out.exists() and any(shards_folder(out).glob("*.pt"))


def test_a_bad_example_in_one_process_share_stops_every_process_naming_it(models, shared_data, tmp_path, capsys):
    """A model whose embedding of 'zebra' overflows (finite weights, so loading accepts them) gives
    NaN outputs on the one example whose question has the word: only the process that runs that
    example meets them."""
    model = get_task("hotpotqa").load("model").from_pretrained(models / "hotpotqa")
    with torch.no_grad():
        model.encoder.embeddings.word_embeddings.weight[default_tokenizer().convert_tokens_to_ids("zebra")] = 3e38
    model.save_pretrained(tmp_path / "model")
    default_tokenizer().save_pretrained(tmp_path / "model")
    examples = json.loads((shared_data / HOTPOTQA_GOLD).read_text(encoding="utf-8"))[:8]
    examples[5]["question"] = "zebra " + examples[5]["question"]
    data = tmp_path / "bad.json"
    data.write_text(json.dumps(examples), encoding="utf-8")
    out = tmp_path / "pred.json"
    argv = predict_argv("hotpotqa", tmp_path / "model", data, out)
    torch.set_num_threads(1)
    capsys.readouterr()
    assert main(argv) == 2
    error = capsys.readouterr().err.strip()  # what one process says
    assert error.startswith(f"longdoc predict: error: example {examples[5]['_id']!r}: the model's ")
    run = subprocess.run(torchrun(2, argv), cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert_every_process_ended_with(run, error)
    # Each process met the error itself (torchrun's summary gives each one's; the second may be stopped
    # by torchrun after it wrote it).
    assert run.stderr.count(f"traceback : {error}\n") == 2
    assert not out.exists()


def test_bad_data_stops_every_process_with_one_line_and_writes_nothing(models, shared_data, tmp_path):
    examples = json.loads((shared_data / HOTPOTQA_GOLD).read_text(encoding="utf-8"))
    examples[40]["context"] = 42
    data = tmp_path / "bad.json"
    data.write_text(json.dumps(examples), encoding="utf-8")
    out = tmp_path / "pred.json"
    run = subprocess.run(torchrun(2, predict_argv("hotpotqa", models / "hotpotqa", data, out)), cwd=ROOT,
                         env=child_env(), capture_output=True, text=True, timeout=300)
    error = (f"longdoc predict: error: {data}: example {examples[40]['_id']!r}: field 'context' must be a list, "
             "got int")
    assert_every_process_ended_with(run, error)
    assert not out.exists() and not shards_folder(out).exists()


def test_processes_given_different_data_are_refused_before_anything_runs(models, shared_data, tmp_path):
    examples = json.loads((shared_data / HOTPOTQA_GOLD).read_text(encoding="utf-8"))
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text(json.dumps(examples[:4]), encoding="utf-8")
    second.write_text(json.dumps(examples[4:8]), encoding="utf-8")
    out = tmp_path / "pred.json"
    # Each process its own --data: process 0 the first file, process 1 the second.
    argv = predict_argv("hotpotqa", models / "hotpotqa", Path("$DATA"), out)
    run = torchrun_per_process(f'DATA={first}', f'DATA={second}', argv)
    digests = [hashlib.sha256(path.read_bytes()).hexdigest()[:12] for path in (first, second)]
    assert_every_process_ended_with(run, f"longdoc predict: error: --data differs between torchrun's processes "
                                         f"(process 0: {first} (sha256 {digests[0]}); process 1: {second} (sha256 "
                                         f"{digests[1]})); give every process the same file")
    assert not out.exists() and not shards_folder(out).exists()


@pytest.mark.parametrize("saved_by", ["another run", "an older longdoc"])
def test_the_saved_outputs_of_another_run_are_refused_not_mixed_in(models, shared_data, tmp_path, saved_by):
    out = tmp_path / "pred.json"
    folder = shards_folder(out)
    folder.mkdir()
    data = shared_data / HOTPOTQA_GOLD
    if saved_by == "another run":
        run_record = {"task": "hotpotqa", "data_sha256": "0" * 64}
    else:  # this very run, as a longdoc that numbered its packs otherwise wrote it (no shard_layout)
        run_record = asdict(PredictionRun("hotpotqa", sha256_of_data(data), model_fingerprint(models / "hotpotqa"),
                                          2, "cpu", "float32", "torch"))
        del run_record["shard_layout"]
    (folder / "run.json").write_text(json.dumps(run_record), encoding="utf-8")
    (folder / "000000-000000.pt").write_bytes(b"")
    run = subprocess.run(torchrun(2, predict_argv("hotpotqa", models / "hotpotqa", data, out)),
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert_every_process_ended_with(run, f"longdoc predict: error: {folder} holds the outputs of another prediction "
                                         "(other data, model, batch size or placement, or saved by another version "
                                         "of longdoc); remove it, or give another --out")
    assert not out.exists() and (folder / "000000-000000.pt").exists()


def test_a_damaged_saved_pack_stops_every_process_naming_the_file(models, shared_data, tmp_path):
    out = tmp_path / "pred.json"
    folder = shards_folder(out)
    folder.mkdir()
    data = shared_data / HOTPOTQA_GOLD
    run_record = PredictionRun("hotpotqa", sha256_of_data(data), model_fingerprint(models / "hotpotqa"), 2, "cpu",
                               "float32", "torch")
    (folder / "run.json").write_text(json.dumps(asdict(run_record)), encoding="utf-8")
    damaged = folder / "000000-000000.pt"
    damaged.write_bytes(b"not a saved pack")  # (what a disk or a hand, never longdoc's atomic writes, leaves)
    run = subprocess.run(torchrun(2, predict_argv("hotpotqa", models / "hotpotqa", data, out)),
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    # One line, in torchrun's summary too, naming the file; the reason is torch.load's exception's name.
    assert run.returncode != 0 and "exitcode  : 2 " in run.stderr, run.stderr[-3000:]
    assert f"traceback : longdoc predict: error: {damaged}: saved outputs that cannot be read (" in run.stderr
    assert "); remove the file and run the command again: its examples are predicted anew\n" in run.stderr
    assert not out.exists()


def test_a_shards_folder_no_process_can_write_is_refused_naming_each_process(models, shared_data, tmp_path):
    out = tmp_path / "pred.json"
    shards_folder(out).write_text("in the way", encoding="utf-8")
    run = subprocess.run(torchrun(2, predict_argv("hotpotqa", models / "hotpotqa", shared_data / HOTPOTQA_GOLD, out)),
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert_every_process_ended_with(run, f"longdoc predict: error: --out {out}: process 0 cannot write "
                                         f"{shards_folder(out)} (File exists); process 1 cannot write "
                                         f"{shards_folder(out)} (File exists); give a folder every process can write")
    assert not out.exists()


def test_an_out_one_process_cannot_write_is_refused_naming_it_and_the_others_leave_nothing(
        models, shared_data, tmp_path):
    """As on two machines that do not share a disk: the same relative --out, each process in its own
    folder, and where process 1 runs, PRED.shards cannot be made (a file is in the way)."""
    (tmp_path / "first").mkdir(), (tmp_path / "second").mkdir()
    (tmp_path / "second" / "pred.json.shards").write_text("in the way", encoding="utf-8")
    argv = predict_argv("hotpotqa", models / "hotpotqa", shared_data / HOTPOTQA_GOLD, Path("pred.json"))
    run = torchrun_per_process(f'cd {tmp_path}/first', f'cd {tmp_path}/second', argv)
    assert_every_process_ended_with(run, "longdoc predict: error: --out pred.json: process 1 cannot write "
                                         "pred.json.shards (File exists); give a folder every process can write")
    assert not list((tmp_path / "first").iterdir())  # process 0 made its shards folder, then removed it


def test_processes_given_different_out_are_refused_before_anything_runs(models, shared_data, tmp_path):
    argv = predict_argv("hotpotqa", models / "hotpotqa", shared_data / HOTPOTQA_GOLD, Path("$OUT"))
    run = torchrun_per_process(f'OUT={tmp_path}/a.json', f'OUT={tmp_path}/b.json', argv)
    assert_every_process_ended_with(run, f"longdoc predict: error: --out differs between torchrun's processes "
                                         f"(process 0: {tmp_path}/a.json; process 1: {tmp_path}/b.json); give every "
                                         "process the same path")
    assert not list(tmp_path.iterdir())
