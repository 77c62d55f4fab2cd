"""Helpers shared by the task tests."""


def assert_reference_rows_fit(task, metrics: dict) -> None:
    """Each published row of `task` names itself and its source and reports only keys that the
    task's metric really returns (`metrics`, one run of it), as fractions like the metric's own;
    otherwise the leaderboard would show an empty column or a figure on another scale beside our runs."""
    assert task.headline_metric in metrics
    for row in task.reference_rows:
        assert row["name"] and row["source"], row
        assert row["metrics"] and set(row["metrics"]) <= set(metrics), row
        assert all(0 < value <= 1 for value in row["metrics"].values()), row
