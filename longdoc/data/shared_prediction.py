"""`torchrun ... longdoc predict`: one task's prediction shared out among torchrun's processes, one
official file, byte-identical to a single process's.

Every process runs the task's `predict` (longdoc.data.task: it reads the data and builds the
windows, as a single process does) on `SharedRowsModel`, which stands for the task model. Where the
task's `predict` asks the model for the outputs of its windows (`forward_rows`), each process runs
its share of the very batches one process would run (`length_batches` over the same rows), saves
each batch's outputs as it completes it, and the processes then exchange them, so that every
process decodes the same outputs; the main process writes the official file and the scores side
file, the others write theirs into the shards folder, which is removed at the end.

Batches, not examples, are what is shared out: a window's floats depend on the batch it is run in
(its padding and the batch's shape give other sums in the last bits; measured on the CPU: the
scores files of one process at --batch-size 8 and 3 differ), so only the single process's batches
give its bytes. A batch may hold windows of several examples (they are sorted by length), and an
example's windows may fall in two batches. Batches are shared by their cost (rows x padded
length), the dearest first, each to the process with the least work so far.

Resuming: each batch's outputs are written atomically to OUT.shards/ beside --out as soon as they
are complete (`OutputShards`), under the run they belong to (`PredictionRun`: data, model, batch
size, placement). Rerunning the same command, with any number of processes, reuses them and runs
only the batches that are missing; a shards folder of another run is refused, not mixed in.
"""

import hashlib
import io
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from longdoc.errors import InputError
from longdoc.io import atomic_write_bytes, atomic_write_json, hash_file
from longdoc.model.task_model import length_batches
from longdoc.distributed import ProcessInfo, barrier, gather_objects

SHARDS_SUFFIX = ".shards"
RUN_FILE = "run.json"


def shards_folder(out_path: str | os.PathLike) -> Path:
    """Where the outputs of a prediction to `out_path` are kept until it is written: OUT.shards/."""
    path = Path(out_path)
    return path.with_name(path.name + SHARDS_SUFFIX)


def sha256_of_data(path: str | os.PathLike) -> str:
    """The sha256 of a dataset file, or of a folder's files (their relative paths and bytes, in path order)."""
    path, digest = Path(path), hashlib.sha256()
    if path.is_dir():
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(str(file.relative_to(path)).encode("utf-8") + b"\0")
            hash_file(digest, file)
    else:
        hash_file(digest, path)
    return digest.hexdigest()


def model_fingerprint(folder: str | os.PathLike) -> str:
    """The model folder as it is now: its path and each file's name, size and modification time
    (hashing the weights of a large model would cost each run seconds)."""
    folder = Path(folder).resolve()
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file())
    return hashlib.sha256(json.dumps([str(folder), files]).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class PredictionRun:
    """What saved outputs are the outputs of: a rerun reuses them only when all of it is the same."""

    task: str
    data_sha256: str
    model: str  # model_fingerprint of the model folder
    batch_size: int
    device_type: str  # "cpu", "cuda": processes on different GPUs of one kind run the same run
    dtype: str
    runtime: str


@dataclass(frozen=True)
class ProcessShare:
    """What one process ran: its windows and the seconds the model took on them."""

    windows: int
    seconds: float


@dataclass(frozen=True)
class SharedPrediction:
    """What `predict_in_processes` did: the task's PredictionFile (its paths those of the main
    process's files), the windows this run reused from an interrupted one's shards, and each
    process's share, in rank order (how even the sharing was)."""

    predicted: Any  # longdoc.data.prediction.PredictionFile
    reused_windows: int
    windows: int  # of every process, reused ones included
    shares: list[ProcessShare]


class OutputShards:
    """The saved outputs of a run's batches, one file per batch: CALL-BATCH.pt, CALL counting the
    task's requests for outputs (NQ asks once per chunk of examples) and BATCH the batch's number
    among that request's `length_batches`."""

    def __init__(self, folder: Path):
        self.folder = folder

    def _path(self, call: int, batch: int) -> Path:
        return self.folder / f"{call:06d}-{batch:06d}.pt"

    def saved(self, call: int) -> set[int]:
        prefix = f"{call:06d}-"
        return {int(path.stem[len(prefix):]) for path in self.folder.glob(f"{prefix}*.pt")}

    def save(self, call: int, batch: int, outputs: list[dict[str, Tensor]]) -> None:
        buffer = io.BytesIO()
        torch.save(outputs, buffer)
        atomic_write_bytes(self._path(call, batch), buffer.getvalue())

    def load(self, call: int, batch: int) -> list[dict[str, Tensor]]:
        return torch.load(self._path(call, batch), weights_only=True)


def share_by_cost(costs: dict[int, int], processes: int) -> list[list[int]]:
    """The keys of `costs` shared among `processes`: the dearest first, each to the process with the
    least cost so far (ties to the lowest process); each share in ascending key order."""
    loads, shares = [0] * processes, [[] for _ in range(processes)]
    for key in sorted(costs, key=lambda k: (-costs[k], k)):
        process = min(range(processes), key=lambda p: (loads[p], p))
        loads[process] += costs[key]
        shares[process].append(key)
    return [sorted(share) for share in shares]


class SharedRowsModel:
    """A task model whose `forward_rows` is shared among torchrun's processes (see the module
    docstring); everything else is the model's own."""

    def __init__(self, model, processes: ProcessInfo, shards: OutputShards):
        self.model, self.processes, self.shards = model, processes, shards
        self.calls = self.windows = self.reused_windows = self.own_windows = 0
        self.own_seconds = 0.0

    def __getattr__(self, name: str):
        return getattr(self.model, name)

    def forward_rows(self, rows: Sequence[dict[str, Any]], collate: Callable, batch_size: int, progress: bool = True,
                     desc: str = "predicting") -> list[dict[str, Tensor]]:
        """The model's outputs for each row, in the rows' order, in every process (as TaskModel.forward_rows)."""
        call, processes = self.calls, self.processes
        self.calls += 1
        batches = length_batches([len(row["long_input_ids"]) for row in rows], batch_size)
        # A batch saved by an earlier run is loaded by the first process that sees its file.
        loader: dict[int, int] = {}
        for rank, saved in enumerate(gather_objects(processes, self.shards.saved(call))):
            for batch in saved:
                loader.setdefault(batch, rank)
        costs = {b: len(indices) * max(len(rows[i]["long_input_ids"]) for i in indices)
                 for b, indices in enumerate(batches) if b not in loader}
        mine = share_by_cost(costs, processes.world_size)[processes.rank]
        outputs = {b: self.shards.load(call, b) for b, rank in loader.items() if rank == processes.rank}
        with tqdm(total=sum(len(batches[b]) for b in mine), desc=f"{desc} (process 0 of {processes.world_size})",
                  unit=" windows", disable=not progress) as bar:
            for b in mine:
                started = time.perf_counter()
                outputs[b] = self.model.forward_rows([rows[i] for i in batches[b]], collate, batch_size,
                                                     progress=False)
                self.own_seconds += time.perf_counter() - started
                self.own_windows += len(batches[b])
                self.shards.save(call, b, outputs[b])
                bar.update(len(batches[b]))
        results: list[dict[str, Tensor] | None] = [None] * len(rows)
        for share in gather_objects(processes, outputs):
            for b, batch_outputs in share.items():
                for index, output in zip(batches[b], batch_outputs):
                    results[index] = output
        self.windows += len(rows)
        self.reused_windows += sum(len(batches[b]) for b in loader)
        return results


def _agree_on_run(processes: ProcessInfo, run: PredictionRun, data_path: Path, out_path: Path) -> None:
    """InputError, in every process, when the processes were not given the same data (by its sha256),
    --out or model, or run it at other settings."""
    runs = gather_objects(processes, (str(data_path), run, str(out_path)))
    if len({out for _, _, out in runs}) > 1:
        given = "; ".join(f"process {rank}: {out}" for rank, (_, _, out) in enumerate(runs))
        raise InputError(f"--out differs between torchrun's processes ({given}); give every process the same path")
    runs = [(path, other) for path, other, _ in runs]
    if all(other == runs[0][1] for _, other in runs):
        return
    if any(other.data_sha256 != run.data_sha256 for _, other in runs):
        given = "; ".join(f"process {rank}: {path} (sha256 {other.data_sha256[:12]})"
                          for rank, (path, other) in enumerate(runs))
        raise InputError(f"--data differs between torchrun's processes ({given}); give every process the same file")
    fields = [name for name in asdict(run) if len({getattr(other, name) for _, other in runs}) > 1]
    raise InputError(f"torchrun's processes were given different {', '.join(fields)} "
                     "(--model, --batch-size, --device, --dtype, --runtime); give every process the same command")


def _open_shards(processes: ProcessInfo, run: PredictionRun, out_path: Path) -> OutputShards:
    """OUT.shards/ made (or found, from an interrupted run of this very run) where every process can
    write it; InputError in every process naming the process and folder that cannot, or a folder of
    another run."""
    folder = shards_folder(out_path)
    problem = None
    try:
        folder.mkdir(exist_ok=True)
        probe = folder / f".process-{processes.rank}.probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        problem = f"process {processes.rank} cannot write {folder} ({error.strerror or error})"
    problems = [p for p in gather_objects(processes, problem) if p]
    if problems:
        raise InputError(f"--out {out_path}: {'; '.join(problems)}; give a folder every process can write")
    # Every process checks the folder as it sees it: on machines that do not share a disk, each has its own.
    run_file = folder / RUN_FILE
    saved = any(folder.glob("*.pt"))
    if saved and (not run_file.is_file() or json.loads(run_file.read_text(encoding="utf-8")) != asdict(run)):
        problem = (f"{folder} holds the outputs of another prediction (other data, model, batch size or "
                   "placement); remove it, or give another --out")
    elif not saved:  # nothing to reuse: a run stopped before its first batch (e.g. by bad data) is replaced
        atomic_write_json(run_file, asdict(run))
    problems = [p for p in gather_objects(processes, problem) if p]
    if problems:
        raise InputError(problems[0])
    return OutputShards(folder)


def predict_in_processes(predict: Callable, model, data_path: Path, out_path: Path, *, run: PredictionRun,
                         processes: ProcessInfo, progress: bool = True, **predict_options) -> SharedPrediction:
    """`predict(model, data_path, out_path, **predict_options)` (a task's `decode.predict`) run by
    every process of torchrun's group, the model's work shared out (see the module docstring); the
    main process writes `out_path` and its scores side file. The processes first agree on the run
    (the same data by its sha256, --out, model and settings) and on a shards folder every one of them
    can write."""
    _agree_on_run(processes, run, data_path, out_path)
    shards = _open_shards(processes, run, out_path)
    shared = SharedRowsModel(model, processes, shards)
    # The other processes decode the same outputs; their copy of the files goes where it is removed.
    target = out_path if processes.is_main else shards.folder / f"process-{processes.rank}" / out_path.name
    target.parent.mkdir(exist_ok=True)
    # Every process's folder made before any can fail and the main one remove the shards folder: a
    # folder made during that removal would be left behind.
    barrier(processes)
    try:
        # One progress bar, the main process's.
        predicted = predict(shared, data_path, target, progress=progress and processes.is_main, **predict_options)
    except BaseException:
        if processes.is_main and not any(shards.folder.glob("*.pt")):  # nothing saved: leave nothing behind
            shutil.rmtree(shards.folder, ignore_errors=True)
        raise
    shares = gather_objects(processes, ProcessShare(shared.own_windows, shared.own_seconds))  # also a barrier
    # Each process removes the folder as it sees it (on a shared disk, one of them does it).
    shutil.rmtree(shards.folder, ignore_errors=True)
    return SharedPrediction(predicted, shared.reused_windows, shared.windows, shares)
