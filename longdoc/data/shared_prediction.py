"""`torchrun ... longdoc predict`: one task's prediction shared out among torchrun's processes, one
official file, byte-identical to a single process's.

Every process runs the task's `predict` (longdoc.data.task) on `SharedRowsModel`, which stands for
the task model. Where the task scores its examples (`score_examples`, which hands each chunk of
examples to the model's `score_chunk`), the examples are shared out by example: each process builds
the windows of every N-th example to count them, the examples are packed (`example_packs`: the
windows of a pack are batched among themselves, the way one process batches them, so a pack's
floats are one process's bytes), and the packs are shared out by their cost (rows x padded length),
the dearest first, each to the process with the least work so far; a pack, and so an example's
windows, is never split. Each process builds the windows of its own packs only, runs them, saves
each pack's outputs as it completes it, and sends its examples' windows and outputs to the main
process, which decodes every example with the task's decoder and writes the official file and the
scores side file; the others decode nothing and write theirs into the shards folder, which is
removed at the end. (A task that asks for its windows' outputs itself, as WikiHop does with its one
window per example, has its rows shared out the same way by `forward_rows`.)

Progress: every process adds the examples and windows it completes to counters in torchrun's
store (`SharedCounters`); the main process shows them on the one progress bar.

Bad input: a process that meets a bad example (one the task refuses, or outputs that are not
finite) stops, and the processes agree, at the next exchange, on the first such example, which each
of them refuses (one line, exit 2); nothing is written but the packs saved before.

Resuming: each pack's outputs are written atomically to OUT.shards/ beside --out as soon as they
are complete (`OutputShards`), under the run they belong to (`PredictionRun`: data, model, batch
size, placement). Packs do not depend on the number of processes, so rerunning the same command,
with any number of processes, reuses them and runs only the packs that are missing; a shards folder
of another run is refused, not mixed in.
"""

import hashlib
import io
import json
import os
import shutil
import time
import uuid
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from longdoc.data.examples import StructuredExample
from longdoc.data.features import Features
from longdoc.data.prediction import (ChunkTask, Pack, Progress, WindowScores, example_packs, pack_outputs, pack_rows,
                                     refuse_non_finite, window_lengths)
from longdoc.errors import InputError
from longdoc.io import atomic_write_bytes, atomic_write_json, hash_file
from longdoc.distributed import ProcessInfo, SharedCounters, barrier, gather_objects, gather_to_main

SHARDS_SUFFIX = ".shards"
RUN_FILE = "run.json"
# How often the main process reads the others' progress while it waits for them.
PROGRESS_SECONDS = 0.2


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
    """What one process ran: its examples, their windows and the seconds the model took on them."""

    examples: int
    windows: int
    seconds: float


@dataclass(frozen=True)
class SharedPrediction:
    """What `predict_in_processes` did: the task's PredictionFile (its paths those of the main
    process's files), the examples and windows of every process (reused ones included), those this
    run reused from an interrupted one's shards, and each process's share, in rank order (how even
    the sharing was)."""

    predicted: Any  # longdoc.data.prediction.PredictionFile
    examples: int
    windows: int
    reused_examples: int
    reused_windows: int
    shares: list[ProcessShare]


class OutputShards:
    """The saved outputs of a run's packs, one file per pack: CALL-PACK.pt, CALL counting the task's
    requests for outputs (NQ asks once per chunk of examples) and PACK the pack's number among that
    request's packs; a file holds the outputs of the pack's windows, in `pack_rows` order."""

    def __init__(self, folder: Path):
        self.folder = folder

    def _path(self, call: int, pack: int) -> Path:
        return self.folder / f"{call:06d}-{pack:06d}.pt"

    def saved(self, call: int) -> set[int]:
        prefix = f"{call:06d}-"
        return {int(path.stem[len(prefix):]) for path in self.folder.glob(f"{prefix}*.pt")}

    def save(self, call: int, pack: int, outputs: list[dict[str, Tensor]]) -> None:
        buffer = io.BytesIO()
        torch.save(outputs, buffer)
        atomic_write_bytes(self._path(call, pack), buffer.getvalue())

    def load(self, call: int, pack: int) -> list[dict[str, Tensor]]:
        return torch.load(self._path(call, pack), weights_only=True)


def share_by_cost(costs: dict[int, int], processes: int) -> list[list[int]]:
    """The keys of `costs` shared among `processes`: the dearest first, each to the process with the
    least cost so far (ties to the lowest process); each share in ascending key order."""
    loads, shares = [0] * processes, [[] for _ in range(processes)]
    for key in sorted(costs, key=lambda k: (-costs[k], k)):
        process = min(range(processes), key=lambda p: (loads[p], p))
        loads[process] += costs[key]
        shares[process].append(key)
    return [sorted(share) for share in shares]


# A bad example a process met: (its index among the examples of the request, the error's words).
Problem = tuple[int, str] | None


def _refuse_first(problems: Sequence[Problem]) -> None:
    """InputError, in every process, for the first bad example any process met (the one a single
    process meets first)."""
    met = [problem for problem in problems if problem is not None]
    if met:
        raise InputError(min(met)[1])


class SharedRowsModel:
    """A task model whose scoring is shared among torchrun's processes (see the module docstring);
    everything else is the model's own."""

    def __init__(self, model, processes: ProcessInfo, shards: OutputShards):
        self.model, self.processes, self.shards = model, processes, shards
        # One name per run for its counters: the store outlives a run that torchrun restarts.
        self.counters = SharedCounters(processes, f"longdoc-predict/{gather_objects(processes, uuid.uuid4().hex)[0]}/")
        self.calls = self.examples = self.windows = self.reused_examples = self.reused_windows = 0
        self.own_examples = self.own_windows = 0
        self.own_seconds = 0.0

    def __getattr__(self, name: str):
        return getattr(self.model, name)

    def score_chunk(self, chunk: list[StructuredExample], task: ChunkTask, progress: Progress
                    ) -> list[tuple[StructuredExample, list[WindowScores]]]:
        """The examples of `chunk` with their windows' scores, in order, in the main process (nothing
        in the others); as longdoc.data.prediction scores a chunk in one process."""
        processes, call = self.processes, self._next_call()
        # Each process counts the windows of every world_size-th example.
        windows: dict[int, list[Features]] = {}
        problem: Problem = None
        for e in range(processes.rank, len(chunk), processes.world_size):
            try:
                windows[e] = task.windows(chunk[e])
            except InputError as error:
                problem = (e, str(error))
                break
        counted = gather_objects(processes, ({e: window_lengths(w) for e, w in windows.items()}, problem))
        _refuse_first([problem for _, problem in counted])
        lengths = [[] for _ in chunk]
        for counts, _ in counted:
            for e, example_lengths in counts.items():
                lengths[e] = example_lengths
        packs = example_packs(lengths, task.batch_size)
        mine, loaded = self._placement(call, packs, progress)
        kept = {e for p in mine + loaded for e in packs[p].examples}
        windows = {e: example_windows for e, example_windows in windows.items() if e in kept}
        with warnings.catch_warnings():  # their warnings were given when they were counted
            warnings.simplefilter("ignore")
            windows.update({e: task.windows(chunk[e]) for e in sorted(kept - windows.keys())})
        counts = [len(example_lengths) for example_lengths in lengths]

        def run_pack(pack: Pack) -> list[dict[str, Tensor]]:
            rows = {e: [task.inputs(chunk[e], features) for features in windows[e]] for e in pack.examples}
            return self.model.forward_rows(pack_rows(pack, rows), task.collate, task.batch_size, progress=False)

        def check(pack: Pack, outputs: list[dict[str, Tensor]]) -> Problem:
            for e, example_outputs in pack_outputs(pack, counts, outputs):
                try:
                    for output in example_outputs:
                        refuse_non_finite(chunk[e].id, output)
                except InputError as error:
                    return e, str(error)
            return None

        outputs = self._run_packs(call, packs, mine, run_pack, check, progress)
        outputs.update({p: self.shards.load(call, p) for p in loaded})
        scored = {e: [WindowScores(features, output) for features, output in zip(windows[e], example_outputs)]
                  for p, results in outputs.items()
                  for e, example_outputs in pack_outputs(packs[p], counts, results)}
        del windows, outputs
        gathered = gather_to_main(processes, scored)
        if gathered is None:
            return []
        for part in gathered[1:]:
            scored.update(part)
        return [(example, scored[e]) for e, example in enumerate(chunk)]

    def forward_rows(self, rows: Sequence[dict[str, Any]], collate: Callable, batch_size: int, progress: bool = True,
                     desc: str = "predicting") -> list[dict[str, Tensor]]:
        """The model's outputs for each row (one example's one window), in the rows' order, in the main
        process (none in the others), as TaskModel.forward_rows gives them in one process."""
        call = self._next_call()
        packs = example_packs([[len(row["long_input_ids"])] for row in rows], batch_size)
        with tqdm(total=len(rows), desc=desc, unit=" examples", disable=not progress) as bar:
            shown = Progress(bar)
            mine, loaded = self._placement(call, packs, shown)
            outputs = self._run_packs(
                call, packs, mine, lambda pack: self.model.forward_rows([rows[e] for e in pack.examples], collate,
                                                                        batch_size, progress=False),
                lambda pack, outputs: None, shown)
        outputs.update({p: self.shards.load(call, p) for p in loaded})
        gathered = gather_to_main(self.processes, outputs)
        if gathered is None:
            return []
        results: list[dict[str, Tensor] | None] = [None] * len(rows)
        for part in gathered:
            for p, pack_results in part.items():
                for e, output in zip(packs[p].examples, pack_results):
                    results[e] = output
        return results

    def _next_call(self) -> int:
        self.calls += 1
        return self.calls - 1

    def _placement(self, call: int, packs: list[Pack], progress: Progress) -> tuple[list[int], list[int]]:
        """(the packs this process runs, the saved packs it loads): a pack saved by an earlier run is
        loaded by the first process that sees its file, the others are shared out by cost."""
        processes = self.processes
        loader: dict[int, int] = {}
        for rank, saved in enumerate(gather_objects(processes, self.shards.saved(call))):
            for p in saved:
                loader.setdefault(p, rank)
        reused = [packs[p] for p in loader]
        self.examples += sum(len(pack.examples) for pack in packs)
        self.windows += sum(pack.windows for pack in packs)
        self.reused_examples += sum(len(pack.examples) for pack in reused)
        self.reused_windows += sum(pack.windows for pack in reused)
        if processes.is_main:
            self._count(sum(len(pack.examples) for pack in reused), sum(pack.windows for pack in reused), progress)
        mine = share_by_cost({p: pack.cost for p, pack in enumerate(packs) if p not in loader},
                             processes.world_size)[processes.rank]
        return mine, sorted(p for p, rank in loader.items() if rank == processes.rank)

    def _count(self, examples: int, windows: int, progress: Progress) -> None:
        """Add to the counters every process shares; the main process shows them."""
        examples = self.counters.add("examples", examples)
        windows = self.counters.add("windows", windows)
        if self.processes.is_main:
            progress.show(examples, windows)

    def _run_packs(self, call: int, packs: list[Pack], mine: list[int], run_pack: Callable[[Pack], list],
                   check: Callable[[Pack, list], Problem], progress: Progress) -> dict[int, list[dict[str, Tensor]]]:
        """The outputs of this process's packs, by pack, each saved as it is completed; stopped at the
        first bad example, which every process then refuses."""
        outputs, problem = {}, None
        try:
            for p in mine:
                started = time.perf_counter()
                results = run_pack(packs[p])
                self.own_seconds += time.perf_counter() - started
                problem = check(packs[p], results)
                if problem is not None:
                    break
                self.shards.save(call, p, results)
                outputs[p] = results
                self.own_examples += len(packs[p].examples)
                self.own_windows += packs[p].windows
                self._count(len(packs[p].examples), packs[p].windows, progress)
        finally:
            self.counters.add(f"{call}/finished", 1)
        if self.processes.is_main:  # the others' progress, until they are done
            while self.counters.read(f"{call}/finished") < self.processes.world_size:
                time.sleep(PROGRESS_SECONDS)
                self._count(0, 0, progress)
        _refuse_first(gather_objects(self.processes, problem))
        return outputs


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
    # The other processes decode nothing; their (empty) copy of the files goes where it is removed.
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
    shares = gather_objects(processes, ProcessShare(shared.own_examples, shared.own_windows, shared.own_seconds))
    # Each process removes the folder as it sees it (on a shared disk, one of them does it), once
    # every process is done with it (the gather above is also a barrier).
    shutil.rmtree(shards.folder, ignore_errors=True)
    return SharedPrediction(predicted, shared.examples, shared.windows, shared.reused_examples, shared.reused_windows,
                            shares)
