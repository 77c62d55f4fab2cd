"""Run records (`metrics.json`) and the leaderboard built from them.

Every prediction run, and every `longdoc evaluate --out DIR`, writes one `metrics.json` beside its
predictions: task, split, model, config, date, the number of gold examples scored, the gold file's
identity (name, size, sha256) and the metrics as the task's official metric returns them
(fractions with the official key names), so that every number can be re-checked.

`build_leaderboards` gathers such records into one board per task of the registry it is given (the
command line hands over longdoc.tasks' registry: this module imports no task), and ranks only what is
comparable: runs scored on the same gold file (same sha256) under the same split form one ranked
group, sorted by the task's headline metric. The published figures of each task's record
(`Task.reference_rows`) form their own group, labelled with the set they were measured on (the full
dev set); a run joins them only when its gold has that set's file names and example count. A run
scored on a gold derived from another (the same examples, each changed the same way: cut to its
first 512 wordpieces, say; `write_metrics_json(..., derived_from=(gold, how))`) is ranked in the group
of the gold it was derived from, marked as such in its gold cell, so that the comparison it exists for
stands in one table. A run that recorded no split is ranked apart from the dev runs; a metrics.json without the gold's identity
(written before it was recorded) is shown, flagged, and never ranked. A reference row shows only the
figures its paper published; other cells stay empty.
"""

import glob
import gzip
import hashlib
import json
import math
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from longdoc.errors import InputError
from longdoc.io import atomic_write_json, hash_file, read_json
from longdoc.evaluate.tables import markdown_table
from longdoc.data.task import TaskLookup

METRICS_FILE = "metrics.json"


@dataclass(frozen=True)
class RunRecord:
    """One metrics.json."""

    task: str
    split: str | None
    model: str | None
    config: Any
    date: str
    metrics: dict[str, float]
    path: Path
    examples: int | None = None  # gold examples scored; None in a metrics.json written before it was recorded
    gold: dict | None = None  # {"files": [name, ...], "bytes", "sha256"}; None likewise


@dataclass(frozen=True)
class LeaderboardRow:
    model: str
    split: str | None
    date: str | None
    source: str  # the run's metrics.json, or the paper a reference row comes from
    reference: bool
    metrics: dict[str, float]
    examples: int | None
    gold: str  # the gold's files and short hash, or the set a reference row was measured on
    rank: int | None = None  # within its group; None where the group is not ranked


@dataclass(frozen=True)
class RowGroup:
    """Rows scored on one gold set: ranked among themselves, never against another group."""

    title: str
    ranked: bool
    rows: list[LeaderboardRow]


@dataclass(frozen=True)
class TaskLeaderboard:
    task: str
    headline_metric: str
    columns: list[str]
    groups: list[RowGroup]

    def to_markdown(self) -> str:
        header = ["rank", "model", "split", "examples", "gold", *self.columns, "date", "source"]
        sections = [f"### {self.task} (sorted by {self.headline_metric}; ranked within each gold set only)"]
        for group in self.groups:
            rows = [
                [
                    "" if row.rank is None else str(row.rank),
                    f"{row.model} [reference]" if row.reference else row.model,
                    row.split or "unknown",
                    "" if row.examples is None else str(row.examples),
                    row.gold,
                    *(_format_value(row.metrics.get(column)) for column in self.columns),
                    row.date or "",
                    row.source,
                ]
                for row in group.rows
            ]
            sections.append(f"#### {group.title}\n\n" + markdown_table(header, rows))
        return "\n\n".join(sections)

    def to_json(self) -> dict:
        return {
            "headline_metric": self.headline_metric,
            "columns": self.columns,
            "groups": [{"title": group.title, "ranked": group.ranked, "rows": [asdict(row) for row in group.rows]}
                       for group in self.groups],
        }


def _format_value(value: float | None) -> str:
    # Four decimals are enough to rank runs; metrics.json and --json keep every digit. Rounding then
    # printing the shortest form shows a published .813 as 0.813, never with invented digits.
    return "" if value is None else repr(round(value, 4))


def _require_task(task: str, tasks: TaskLookup, where: str) -> None:
    if task not in tasks.names():
        raise InputError(f"{where}unknown task {task!r}; known tasks: {', '.join(tasks.names())}")


def _check_metrics(metrics: Any, where: str) -> dict[str, float]:
    if not isinstance(metrics, dict) or not metrics:
        raise InputError(f"{where}: 'metrics' must be a non-empty JSON object of numbers")
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InputError(f"{where}: metric {key!r} must be a finite number, got {value!r}")
    return metrics


def gold_files(gold) -> list[Path]:
    """The gold file, or the shards a glob pattern names (Natural Questions' dev set is five)."""
    path = Path(gold)
    if path.is_file():
        return [path]
    files = sorted(Path(found) for found in glob.glob(str(gold)) if Path(found).is_file())
    if not files:
        raise FileNotFoundError(f"no gold file: {gold}")
    return files


def _count_examples(path: Path) -> int:
    """Records in a gold file: the items of a JSON list (HotpotQA, WikiHop), else its non-blank
    JSON lines (Natural Questions, OpenKP), counted without parsing them."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        if handle.read(4096).lstrip().startswith(b"["):
            return len(read_json(path))
        handle.seek(0)
        return sum(1 for line in handle if line.strip())


def gold_identity(gold) -> tuple[int, dict]:
    """(examples, identity) of a gold file or glob: the number of gold examples, which the official
    metrics all average over (a question without a prediction scores 0), and the files' names,
    total size and the sha256 of their bytes in name order."""
    files = gold_files(gold)
    digest, size = hashlib.sha256(), 0
    for path in files:
        size += hash_file(digest, path)
    examples = sum(_count_examples(path) for path in files)
    return examples, {"files": [path.name for path in files], "bytes": size, "sha256": digest.hexdigest()}


def write_metrics_json(run_dir, *, task: str, split: str | None, model: str | None, config: Any,
                       metrics: dict[str, float], gold, derived_from: tuple[Any, str] | None = None) -> Path:
    """Write run_dir/metrics.json atomically: one run's metrics and what re-checks them.

    The record is stamped with the current UTC date and time, the number of examples and the
    identity of the gold file (or glob) the metrics were scored on (`gold_identity`).

    Args:
        run_dir: the folder the record is written into (beside the run's predictions).
        task: the name of the task (its record's) whose metric gave the metrics.
        split: the split scored, e.g. "dev"; None: not recorded (the run is ranked apart from the
            dev runs).
        model: the model that predicted (its folder, or a description); None: not recorded.
        config: the settings the run used, recorded as given (JSON values).
        metrics: the task's official metrics by name, each a finite number.
        gold: the gold file, or a glob of its shards, the metrics were scored on.
        derived_from: (the gold file `gold` was made from, how: e.g. "each example cut to its first
            512 wordpieces"), recorded in the gold's identity as "derived_from" (the original's
            identity and "how"); None: `gold` is an original.

    Returns:
        The path of metrics.json.

    Raises:
        InputError: `metrics` empty or holding a value that is not a finite number; a derived gold
            with another number of examples than its original.
        FileNotFoundError: no gold file at `gold` (or its original).
    """
    metrics = _check_metrics(dict(metrics), f"metrics for {task}")
    examples, identity = gold_identity(gold)
    if derived_from is not None:
        original, how = derived_from
        original_examples, original_identity = gold_identity(original)
        if original_examples != examples:
            raise InputError(f"{gold}: {examples} examples, derived from {original} with {original_examples}: a "
                             "derived gold holds the same examples")
        identity["derived_from"] = {**original_identity, "how": how}
    record = {
        "task": task,
        "split": split,
        "model": model,
        "config": config,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "examples": examples,
        "gold": identity,
        "metrics": metrics,
    }
    path = Path(run_dir) / METRICS_FILE
    atomic_write_json(path, record)
    return path


def _check_gold(gold: Any, where: str) -> dict:
    files = gold.get("files") if isinstance(gold, dict) else None
    if (not isinstance(files, list) or not files or not all(isinstance(name, str) for name in files)
            or isinstance(gold.get("bytes"), bool) or not isinstance(gold.get("bytes"), int)
            or not isinstance(gold.get("sha256"), str) or len(gold["sha256"]) != 64):
        raise InputError(f"{where}: 'gold' must be {{\"files\": [name, ...], \"bytes\": int, \"sha256\": 64 hex digits}}")
    if "derived_from" in gold:
        _check_gold(gold["derived_from"], f"{where}: gold.derived_from")
        if not isinstance(gold["derived_from"].get("how"), str):
            raise InputError(f"{where}: gold.derived_from.how must be text (how the gold was derived)")
    return gold


def read_metrics_json(path, tasks: TaskLookup) -> RunRecord:
    """Read and check one metrics.json (its task one of `tasks`); errors name the file and the field.
    `examples` and `gold` may be absent (a record written before they were recorded): such a run is
    shown, never ranked."""
    path = Path(path)
    record = read_json(path)
    if not isinstance(record, dict):
        raise InputError(f"{path}: a metrics.json is one JSON object")
    for field in ("task", "date", "metrics"):
        if field not in record:
            raise InputError(f"{path}: missing field {field!r}")
    _require_task(record["task"], tasks, f"{path}: ")
    for field in ("split", "model"):
        if record.get(field) is not None and not isinstance(record[field], str):
            raise InputError(f"{path}: {field!r} must be text or null")
    examples = record.get("examples")
    if examples is not None and (isinstance(examples, bool) or not isinstance(examples, int) or examples < 1):
        raise InputError(f"{path}: 'examples' must be a positive whole number, got {examples!r}")
    gold = None if record.get("gold") is None else _check_gold(record["gold"], str(path))
    return RunRecord(
        task=record["task"], split=record.get("split"), model=record.get("model"), config=record.get("config"),
        date=str(record["date"]), metrics=_check_metrics(record["metrics"], str(path)), path=path,
        examples=examples, gold=gold,
    )


def find_runs(paths: Iterable, tasks: TaskLookup) -> list[RunRecord]:
    """Every metrics.json under the given folders (searched recursively) or given directly."""
    runs = []
    for path in map(Path, paths):
        if path.is_dir():
            runs.extend(read_metrics_json(found, tasks) for found in sorted(path.rglob(METRICS_FILE)))
        elif path.is_file():
            runs.append(read_metrics_json(path, tasks))
        else:
            raise FileNotFoundError(f"no such file or folder: {path}")
    return runs


def _describe_gold(gold: dict) -> str:
    described = f"{', '.join(gold['files'])} (sha256 {gold['sha256'][:12]})"
    derived = gold.get("derived_from")
    return described if derived is None else f"{described}, derived: {derived['how']}"


def _run_row(run: RunRecord) -> LeaderboardRow:
    return LeaderboardRow(
        model=run.model or run.path.parent.name, split=run.split, date=run.date, source=str(run.path),
        reference=False, metrics=run.metrics, examples=run.examples,
        gold=_describe_gold(run.gold) if run.gold else "not recorded",
    )


def _reference_row(reference: dict) -> LeaderboardRow:
    measured_on = reference.get("measured_on") or {}
    return LeaderboardRow(
        model=reference["name"], split="dev", date=None, source=reference["source"], reference=True,
        metrics=reference["metrics"], examples=measured_on.get("examples"), gold=measured_on.get("set", "not stated"),
    )


def _on_published_set(run: RunRecord, measured_on: dict) -> bool:
    """Whether a run was scored on the set the papers measured: its split is dev and its gold has
    that set's file names and example count (the published files' hashes are not known to us)."""
    return (run.split == "dev" and bool(measured_on) and run.examples == measured_on["examples"]
            and sorted(run.gold["files"]) == sorted(measured_on["files"]))


def _sorted_rows(rows: list[LeaderboardRow], headline: str, ranked: bool) -> list[LeaderboardRow]:
    # Highest headline first; rows without it (a paper that did not publish it) go last, unranked.
    rows = sorted(rows, key=lambda row: (headline not in row.metrics, -row.metrics.get(headline, 0.0), row.reference,
                                         row.model))
    if not ranked:
        return rows
    return [replace(row, rank=position if headline in row.metrics else None)
            for position, row in enumerate(rows, start=1)]


def _task_groups(runs: list[RunRecord], references: tuple[dict, ...], headline: str) -> list[RowGroup]:
    """The published set's group first (with the runs on that set), then one group per (split, gold)
    in split and file order, the runs with an unrecorded split after those with one, the runs
    without the gold's identity last and unranked."""
    measured_on = next((reference["measured_on"] for reference in references if reference.get("measured_on")), {})
    published = [_reference_row(reference) for reference in references]
    by_gold: dict[tuple, list[LeaderboardRow]] = {}
    with_derived: set[tuple] = set()  # the groups that hold a run on a derived gold
    unidentified = []
    for run in runs:
        if run.gold is None or run.examples is None:
            unidentified.append(_run_row(run))
        elif _on_published_set(run, measured_on):
            published.append(_run_row(run))
        else:
            ranked_on = run.gold.get("derived_from", run.gold)  # a derived gold ranks with its original
            key = (run.split is None, run.split or "", tuple(ranked_on["files"]), ranked_on["sha256"])
            by_gold.setdefault(key, []).append(_run_row(run))
            if "derived_from" in run.gold:
                with_derived.add(key)
    groups = []
    if published:
        if measured_on:
            title = (f"{measured_on['set']} ({measured_on['examples']} examples, {', '.join(measured_on['files'])}): "
                     "published figures, with the runs whose dev gold has these files and example count")
        else:
            title = "published figures (the set they were measured on is not stated)"
        groups.append(RowGroup(title, True, _sorted_rows(published, headline, ranked=True)))
    for key, rows in sorted(by_gold.items()):
        _, split, files, sha256 = key
        gold = f"{', '.join(files)}: {rows[0].examples} examples, sha256 {sha256[:12]}"
        if key in with_derived:
            gold += " (with the runs on golds derived from it, marked)"
        title = f"split {split}, gold {gold}" if split else f"split not recorded (ranked apart from dev runs), gold {gold}"
        groups.append(RowGroup(title, True, _sorted_rows(rows, headline, ranked=True)))
    if unidentified:
        groups.append(RowGroup("not ranked: metrics.json without the gold's identity and example count "
                               "(written before they were recorded)", False, _sorted_rows(unidentified, headline, ranked=False)))
    return groups


def build_leaderboards(runs: list[RunRecord], tasks: TaskLookup, columns: list[str] | None = None
                       ) -> list[TaskLeaderboard]:
    """One leaderboard per task of `tasks` that has runs, in registry order, its rows in groups of
    the same gold set (see the module docstring), each by descending headline metric.

    `columns` narrows the metric columns to those named that the task's rows report (the headline
    metric always comes first); by default every key reported, in the order the metric returns them.
    """
    boards = []
    for name in tasks.names():
        task_runs = [run for run in runs if run.task == name]
        if not task_runs:
            continue
        task = tasks.get(name)
        headline = task.headline_metric
        groups = _task_groups(task_runs, task.reference_rows, headline)
        reported = list(dict.fromkeys([headline] + [key for group in groups for row in group.rows for key in row.metrics]))
        # Chosen columns apply to every task: each table keeps those its rows report.
        chosen = reported if columns is None else [headline] + [key for key in columns if key in reported and key != headline]
        boards.append(TaskLeaderboard(task=name, headline_metric=headline, columns=chosen, groups=groups))
    return boards


def leaderboards_json(boards: list[TaskLeaderboard]) -> str:
    return json.dumps({board.task: board.to_json() for board in boards}, indent=2)


def leaderboards_markdown(boards: list[TaskLeaderboard]) -> str:
    return "\n\n".join(board.to_markdown() for board in boards)
