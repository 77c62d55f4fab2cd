"""`torchrun ... longdoc predict`: one task's prediction shared out among torchrun's processes, one
official file, byte-identical to a single process's.

Every process runs the task's `predict` (longdoc.data.task) on `SharedRowsModel`, which stands for
the task model. Where the task decodes its examples (`decode_examples`, which hands the reader,
the windows, the batching and the task's decoder to the model's `decode_examples`), the examples are
shared out by example, over the whole set: each process reads the examples, building the windows of
every N-th one to count them (keeping their lengths only); the examples are packed (`chunk_packs`:
as one process reads them, chunk by chunk for a reader that streams; the windows of a pack are
batched among themselves, the way one process batches them, so a pack's floats are one process's
bytes), and the packs of the whole set are shared out by their cost (rows x padded length), the
dearest first, each to the process with the least work so far; a pack, and so an example's windows,
is never split. Each process then reads the examples again, and as soon as the last example of one
of its packs is read, builds that pack's windows, runs them, saves their outputs, decodes the pack's
examples with the task's decoder and lets go of their windows and outputs: no process holds more
than one pack's windows and outputs at a time. The main process receives the decoded examples (what
the task's files keep of each: answers, scores) and writes the official file and the scores side
file; the others write theirs, empty, into the shards folder, which is removed at the end.

Progress: every process adds the examples and windows it completes to counters in torchrun's
store (`SharedCounters`); the main process shows them on the one progress bar.

Bad input: a process that meets a bad example (one the task refuses, or outputs that are not
finite) stops and says so in torchrun's store; the others stop before their next pack, and the
processes agree on the first bad example met, which each of them refuses (one line, exit 2);
nothing is written but the packs saved before.

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
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import Tensor

from longdoc.data.examples import StructuredExample
from longdoc.data.prediction import (ChunkTask, Pack, Problem, Progress, example_packs, refuse_first,
                                     window_lengths)
from longdoc.errors import InputError
from longdoc.io import atomic_write_bytes, atomic_write_json, hash_file
from longdoc.distributed import ProcessInfo, SharedCounters, barrier, gather_objects, gather_to_main

SHARDS_SUFFIX = ".shards"
RUN_FILE = "run.json"
# Raised whenever the packs' numbering or what a pack's file holds changes (2: NQ's packs numbered
# over the whole file, not within each chunk of examples).
SHARD_LAYOUT = 2
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
    # How packs are numbered and saved: a longdoc that numbers them otherwise must not reuse them.
    shard_layout: int = SHARD_LAYOUT


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
    requests for decoded examples (each task asks once) and PACK the pack's number among that
    request's packs (`chunk_packs`); a file holds the outputs of the pack's windows, in `pack_rows`
    order."""

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
        """The pack's saved outputs; InputError naming the file where it cannot be read (longdoc writes
        it whole, so something else damaged it)."""
        path = self._path(call, pack)
        try:
            return torch.load(path, weights_only=True)
        except Exception as error:  # (torch.load fails in many ways on a damaged file)
            raise InputError(f"{path}: saved outputs that cannot be read ({type(error).__name__}); remove the "
                             "file and run the command again: its examples are predicted anew") from error


def share_by_cost(costs: dict[int, int], processes: int) -> list[list[int]]:
    """The keys of `costs` shared among `processes`: the dearest first, each to the process with the
    least cost so far (ties to the lowest process); each share in ascending key order."""
    loads, shares = [0] * processes, [[] for _ in range(processes)]
    for key in sorted(costs, key=lambda k: (-costs[k], k)):
        process = min(range(processes), key=lambda p: (loads[p], p))
        loads[process] += costs[key]
        shares[process].append(key)
    return [sorted(share) for share in shares]


def chunk_packs(lengths: Sequence[Sequence[int]], batch_size: int, chunk_size: int | None) -> list[Pack]:
    """The packs of every example (`example_packs` of each chunk of `chunk_size` examples, as one
    process reads them; None: one chunk), numbering the examples over the whole set."""
    size = chunk_size or max(len(lengths), 1)
    return [Pack(tuple(start + e for e in pack.examples), pack.windows, pack.cost)
            for start in range(0, len(lengths), size)
            for pack in example_packs(lengths[start:start + size], batch_size)]


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

    def decode_examples(self, read: Callable[[], Iterable[StructuredExample]], task: ChunkTask,
                        chunk_size: int | None, progress: Progress) -> list[Any]:
        """The decoded examples of `read()`, in order, in the main process (nothing in the others); as
        longdoc.data.prediction decodes them in one process. Each process reads the examples twice:
        once to count the windows of every N-th one, then to build, run and decode those of its own
        packs, a pack as soon as its last example is read."""
        processes, call = self.processes, self._next_call()
        lengths: dict[int, list[int]] = {}
        problem: Problem = None
        for e, example in enumerate(read()):  # read to the end, so that every process meets the reader's errors
            if problem is None and e % processes.world_size == processes.rank:
                try:
                    lengths[e] = window_lengths(task.windows(example))
                except InputError as error:
                    problem = (e, str(error))
        counted = gather_objects(processes, (lengths, problem))
        refuse_first([problem for _, problem in counted])
        every = {e: example_lengths for counts, _ in counted for e, example_lengths in counts.items()}
        count = len(every)
        packs = chunk_packs([every[e] for e in range(count)], task.batch_size, chunk_size)
        del lengths, counted, every
        if processes.is_main:
            progress.bar.total = count
        mine, loaded = self._placement(call, packs, progress)
        decoded, problem = self._run_packs(call, read, task, packs, mine, loaded, progress)
        refuse_first(gather_objects(processes, problem))
        gathered = gather_to_main(processes, decoded)
        if gathered is None:
            return []
        for part in gathered[1:]:
            decoded.update(part)
        if len(decoded) != count:
            raise InputError(f"the data gave {count} examples when first read and fewer the second time: it changed "
                             "during the run; run again on data that does not change")
        return [decoded[e] for e in range(count)]

    def forward_rows(self, *args, **kwargs):
        """Refused: a task whose `predict` ran its rows itself would have every process run every row."""
        raise NotImplementedError("under torchrun, a task's predict runs its model through "
                                  "longdoc.data.prediction.decode_examples, which shares the examples out")

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

    def _run_packs(self, call: int, read: Callable[[], Iterable[StructuredExample]], task: ChunkTask,
                   packs: list[Pack], mine: list[int], loaded: list[int], progress: Progress
                   ) -> tuple[dict[int, Any], Problem]:
        """({example: decoded} of this process's packs, run (each saved as it is completed) or loaded;
        the bad example it met, if any). A pack is run once its last example is read, and its examples
        and windows are dropped once decoded; a process stops at the first bad example it meets, or
        at its next pack once another process has met one."""
        try:
            result = self._decode_share(call, read, task, packs, mine, loaded, progress)
        finally:
            self.counters.add(f"{call}/finished", 1)
        if self.processes.is_main:  # the others' progress, until they are done
            while self.counters.read(f"{call}/finished") < self.processes.world_size:
                time.sleep(PROGRESS_SECONDS)
                self._count(0, 0, progress)
        return result

    def _decode_share(self, call: int, read: Callable[[], Iterable[StructuredExample]], task: ChunkTask,
                      packs: list[Pack], mine: list[int], loaded: list[int], progress: Progress
                      ) -> tuple[dict[int, Any], Problem]:
        ready: dict[int, list[int]] = {}  # the packs to run or load once example e is read
        for p in sorted(mine + loaded):
            ready.setdefault(max(packs[p].examples), []).append(p)
        wanted = {e for p in mine + loaded for e in packs[p].examples}
        held: dict[int, StructuredExample] = {}
        decoded: dict[int, Any] = {}
        stopped = f"{call}/stopped"
        with warnings.catch_warnings():  # their warnings were given when they were counted
            warnings.simplefilter("ignore")
            for e, example in enumerate(read()):
                if not ready:
                    break
                if e in wanted:
                    held[e] = example
                for p in ready.pop(e, []):
                    if self.counters.read(stopped):  # another process met a bad example
                        return decoded, None
                    pack_decoded, problem = self._decode_pack(call, task, p, packs[p], held, p in mine, progress)
                    if problem is not None:
                        self.counters.add(stopped, 1)
                        return decoded, problem
                    decoded.update(pack_decoded)
        return decoded, None

    def _decode_pack(self, call: int, task: ChunkTask, p: int, pack: Pack, held: dict[int, StructuredExample],
                     own: bool, progress: Progress) -> tuple[dict[int, Any], Problem]:
        """A pack's examples decoded, its outputs run and saved (`own`) or loaded, its examples let go."""
        windows = {e: task.windows(held[e]) for e in pack.examples}
        if own:
            started = time.perf_counter()
            outputs = task.run_pack(self.model, pack, held, windows)
            seconds = time.perf_counter() - started
        else:
            try:
                outputs = self.shards.load(call, p)
            except InputError as error:
                return {}, (min(pack.examples), str(error))
        decoded, problem = task.decode_pack(pack, held, windows, outputs)
        if problem is not None:
            return decoded, problem
        if own:
            self.shards.save(call, p, outputs)
            self.own_seconds += seconds
            self.own_examples += len(pack.examples)
            self.own_windows += pack.windows
            self._count(len(pack.examples), pack.windows, progress)
        for e in pack.examples:
            del held[e]
        return decoded, None


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
    problem, made = None, False
    try:
        try:
            folder.mkdir()
            made = True
        except FileExistsError:
            if not folder.is_dir():
                raise
        probe = folder / f".process-{processes.rank}.probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        problem = f"process {processes.rank} cannot write {folder} ({error.strerror or error})"
    problems = [p for p in gather_objects(processes, problem) if p]
    if problems:
        if made:  # nothing half-made left behind: the folder is empty (every probe was done at the gather)
            shutil.rmtree(folder, ignore_errors=True)
        raise InputError(f"--out {out_path}: {'; '.join(problems)}; give a folder every process can write")
    # Every process checks the folder as it sees it: on machines that do not share a disk, each has its own.
    run_file = folder / RUN_FILE
    saved = any(folder.glob("*.pt"))
    if saved and (not run_file.is_file() or json.loads(run_file.read_text(encoding="utf-8")) != asdict(run)):
        problem = (f"{folder} holds the outputs of another prediction (other data, model, batch size or "
                   "placement, or saved by another version of longdoc); remove it, or give another --out")
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
