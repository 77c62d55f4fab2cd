"""The prediction browser behind `longdoc serve --task TASK --gold FILE --pred FILE...`.

One gold file and its prediction files ("runs"): each run's totals are the task's official metric
on the two files, computed as `longdoc evaluate` computes them (the same function, the same
options), with the metric's warnings kept as the run's notes; the examples and their per-example
figures come from the task's browse module (`Task.browse`, contract in longdoc.serve.views).

Runs can also come from the leaderboard: the metrics.json files under `run_dirs` (`longdoc
evaluate --out`, prediction runs) of the same task form its table, and a run whose metrics.json
records its prediction file, scored on this very gold file (same sha256), is browsable too: its row
links to it.
"""

import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from longdoc.errors import InputError
from longdoc.evaluate.leaderboard import build_leaderboards, find_runs, gold_identity
from longdoc.evaluate.scoring import score_files
from longdoc.serve.views import ExampleBrowser
from longdoc.data.task import TaskLookup


@dataclass(frozen=True)
class Run:
    name: str
    file: str
    totals: dict[str, float]  # what `longdoc evaluate TASK --gold GOLD --pred FILE --json` prints
    notes: tuple[str, ...]  # the metric's warnings on these files (missing predictions, ...)


def _recorded_prediction(record, gold_sha256: str) -> Path | None:
    """The prediction file a metrics.json names, when it was scored on the gold of this sha256 and
    is still there."""
    config = record.config if isinstance(record.config, dict) else {}
    pred = config.get("pred")
    if not isinstance(pred, str) or record.gold is None or record.gold.get("sha256") != gold_sha256:
        return None
    path = Path(pred) if Path(pred).is_absolute() else record.path.parent / pred
    return path if path.is_file() else None


def _names(paths: Sequence[Path]) -> list[str]:
    """File names, with their folder where two runs share a name."""
    names = [path.name for path in paths]
    return [f"{path.parent.name}/{path.name}" if names.count(path.name) > 1 else path.name for path in paths]


class PredictionBrowser:
    def __init__(self, tasks: TaskLookup, task: str, gold, preds: Sequence, metric_options: dict | None = None,
                 run_dirs: Sequence = (), allow_missing: bool = False):
        """`tasks`: the registry (`longdoc.tasks.REGISTRY`) that `task` and the runs' tasks are found in;
        `allow_missing`: score prediction files that leave gold examples out (longdoc.evaluate.ids)."""
        self.task = tasks.get(task)
        if self.task.browse is None:
            raise InputError(f"the {task} task has no prediction browser")
        self.gold = Path(gold)
        self.metric_options = dict(metric_options or {})
        paths = [Path(pred) for pred in preds]
        for path in [self.gold, *paths]:
            if not path.is_file():
                raise InputError(f"{path}: no such file")
        names = _names(paths)
        self.leaderboard = None
        if run_dirs:
            records = [record for record in find_runs(run_dirs, tasks) if record.task == task]
            _, identity = gold_identity(self.gold)
            known = {path.resolve(): number for number, path in enumerate(paths)}
            sources = {}  # metrics.json -> its run's number
            for record in records:
                recorded = _recorded_prediction(record, identity["sha256"])
                if recorded is None:
                    continue
                if recorded.resolve() not in known:
                    known[recorded.resolve()] = len(paths)
                    paths.append(recorded)
                    names.append(record.model or record.path.parent.name)
                sources[str(record.path)] = known[recorded.resolve()]
            boards = build_leaderboards(records, tasks)
            self.leaderboard = boards[0].to_json() if boards else None
            for group in (self.leaderboard or {}).get("groups", []):
                for row in group["rows"]:
                    row["run"] = sources.get(row["source"])
        if not paths:
            raise InputError("no prediction file to browse: give --pred FILE, or --runs DIR with metrics.json files "
                             f"that record a prediction file scored on {self.gold}")
        self.runs = []
        for name, path in zip(names, paths):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                totals = score_files(self.task, self.gold, path, allow_missing=allow_missing, **self.metric_options)
            self.runs.append(Run(name, str(path), totals, tuple(str(warning.message) for warning in caught)))
        self.examples: ExampleBrowser = self.task.load("browse").open_browser(self.gold, paths, **self.metric_options)
        self._rows = {row.id: row for row in self.examples.rows}

    def info(self) -> dict:
        facets: dict[str, list[str]] = {}
        for row in self.examples.rows:
            for name, value in row.facets.items():
                facets.setdefault(name, [])
                if value not in facets[name]:
                    facets[name].append(value)
        return {"mode": "browse", "task": self.task.name, "gold": str(self.gold), "examples": len(self.examples.rows),
                "right_means": self.examples.right_means, "metric_keys": list(self.examples.metric_keys),
                "totals_are_means": self.examples.totals_are_means, "headline_metric": self.task.headline_metric,
                "metric_options": self.metric_options, "runs": [asdict(run) for run in self.runs],
                "facets": {name: sorted(values) for name, values in facets.items()}, "leaderboard": self.leaderboard}

    def rows_json(self) -> list[dict]:
        return [row.to_json() for row in self.examples.rows]

    def example_json(self, example_id: str) -> dict | None:
        """One example in full (its row and its view); None when the gold has no such id."""
        row = self._rows.get(example_id)
        return None if row is None else {**row.to_json(), **self.examples.view(example_id).to_json()}
