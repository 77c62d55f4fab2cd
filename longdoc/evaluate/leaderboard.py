"""Run records (`metrics.json`) and the leaderboard built from them.

Every prediction run, and every `longdoc evaluate --out DIR`, writes one `metrics.json` beside its
predictions: task, split, model, config, date and the metrics as the task's official metric
returns them (fractions with the official key names), so that every number can be re-checked.
`build_leaderboards` gathers such records into one table per task, sorted by the task's headline
metric, with the published dev figures of each task's record (`Task.reference_rows`) as marked
reference rows. A reference row shows only the figures its paper published; other cells stay empty.
"""

import json
import math
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from longdoc.errors import InputError
from longdoc.io import atomic_write_json, read_json
from longdoc.evaluate.tables import markdown_table
from longdoc.tasks import get_task, task_names

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


@dataclass(frozen=True)
class LeaderboardRow:
    model: str
    split: str | None
    date: str | None
    source: str  # the run's metrics.json, or the paper a reference row comes from
    reference: bool
    metrics: dict[str, float]


@dataclass(frozen=True)
class TaskLeaderboard:
    task: str
    headline_metric: str
    columns: list[str]
    rows: list[LeaderboardRow]

    def to_markdown(self) -> str:
        header = ["model", "split", *self.columns, "date", "source"]
        rows = [
            [
                f"{row.model} [reference]" if row.reference else row.model,
                row.split or "",
                *(_format_value(row.metrics.get(column)) for column in self.columns),
                row.date or "",
                row.source,
            ]
            for row in self.rows
        ]
        return f"### {self.task} (sorted by {self.headline_metric})\n\n" + markdown_table(header, rows)

    def to_json(self) -> dict:
        return {
            "headline_metric": self.headline_metric,
            "columns": self.columns,
            "rows": [asdict(row) for row in self.rows],
        }


def _format_value(value: float | None) -> str:
    # Four decimals are enough to rank runs; metrics.json and --json keep every digit. Rounding then
    # printing the shortest form shows a published .813 as 0.813, never with invented digits.
    return "" if value is None else repr(round(value, 4))


def _require_task(task: str, where: str = "") -> None:
    if task not in task_names():
        raise InputError(f"{where}unknown task {task!r}; known tasks: {', '.join(task_names())}")


def _check_metrics(metrics: Any, where: str) -> dict[str, float]:
    if not isinstance(metrics, dict) or not metrics:
        raise InputError(f"{where}: 'metrics' must be a non-empty JSON object of numbers")
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InputError(f"{where}: metric {key!r} must be a finite number, got {value!r}")
    return metrics


def write_metrics_json(run_dir, *, task: str, split: str | None, model: str | None, config: Any,
                       metrics: dict[str, float]) -> Path:
    """Write run_dir/metrics.json atomically, stamped with the current UTC date and time."""
    _require_task(task)
    record = {
        "task": task,
        "split": split,
        "model": model,
        "config": config,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "metrics": _check_metrics(dict(metrics), f"metrics for {task}"),
    }
    path = Path(run_dir) / METRICS_FILE
    atomic_write_json(path, record)
    return path


def read_metrics_json(path) -> RunRecord:
    """Read and check one metrics.json; errors name the file and the field."""
    path = Path(path)
    record = read_json(path)
    if not isinstance(record, dict):
        raise InputError(f"{path}: a metrics.json is one JSON object")
    for field in ("task", "date", "metrics"):
        if field not in record:
            raise InputError(f"{path}: missing field {field!r}")
    _require_task(record["task"], f"{path}: ")
    for field in ("split", "model"):
        if record.get(field) is not None and not isinstance(record[field], str):
            raise InputError(f"{path}: {field!r} must be text or null")
    return RunRecord(
        task=record["task"], split=record.get("split"), model=record.get("model"), config=record.get("config"),
        date=str(record["date"]), metrics=_check_metrics(record["metrics"], str(path)), path=path,
    )


def find_runs(paths: Iterable) -> list[RunRecord]:
    """Every metrics.json under the given folders (searched recursively) or given directly."""
    runs = []
    for path in map(Path, paths):
        if path.is_dir():
            runs.extend(read_metrics_json(found) for found in sorted(path.rglob(METRICS_FILE)))
        elif path.is_file():
            runs.append(read_metrics_json(path))
        else:
            raise FileNotFoundError(f"no such file or folder: {path}")
    return runs


def _run_row(run: RunRecord) -> LeaderboardRow:
    return LeaderboardRow(
        model=run.model or run.path.parent.name, split=run.split, date=run.date, source=str(run.path),
        reference=False, metrics=run.metrics,
    )


def _reference_row(reference: dict) -> LeaderboardRow:
    return LeaderboardRow(
        model=reference["name"], split="dev", date=None, source=reference["source"], reference=True,
        metrics=reference["metrics"],
    )


def build_leaderboards(runs: list[RunRecord], columns: list[str] | None = None) -> list[TaskLeaderboard]:
    """One leaderboard per task that has runs, in registry order, rows by descending headline metric.

    `columns` narrows the metric columns to those named that the task's rows report (the headline
    metric always comes first); by default every key reported, in the order the metric returns them.
    """
    boards = []
    for task in task_names():
        task_runs = [run for run in runs if run.task == task]
        if not task_runs:
            continue
        headline = get_task(task).headline_metric
        rows = [_run_row(run) for run in task_runs] + [_reference_row(ref) for ref in get_task(task).reference_rows]
        reported = list(dict.fromkeys([headline] + [key for row in rows for key in row.metrics]))
        # Chosen columns apply to every task: each table keeps those its rows report.
        chosen = reported if columns is None else [headline] + [key for key in columns if key in reported and key != headline]
        # Highest headline first; rows without it (a paper that did not publish it) go last.
        rows.sort(key=lambda row: (headline not in row.metrics, -row.metrics.get(headline, 0.0), row.reference,
                                   row.model))
        boards.append(TaskLeaderboard(task=task, headline_metric=headline, columns=chosen, rows=rows))
    return boards


def leaderboards_json(boards: list[TaskLeaderboard]) -> str:
    return json.dumps({board.task: board.to_json() for board in boards}, indent=2)


def leaderboards_markdown(boards: list[TaskLeaderboard]) -> str:
    return "\n\n".join(board.to_markdown() for board in boards)
