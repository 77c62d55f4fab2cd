"""`longdoc train --json`: one JSON object on stdout that says how the run ended and what it wrote."""

import json

import pytest
import torch

from longdoc.cli import main
from tests.train import toy_task
from tests.train.test_engine import STEPS, command

pytestmark = pytest.mark.usefixtures("toy_tasks")


@pytest.fixture
def data(tmp_path):
    torch.set_num_threads(1)
    return {
        "init": toy_task.make_init(tmp_path / "init"),
        "train": toy_task.write_data(tmp_path / "train.jsonl", 40, seed=1),
        "dev": toy_task.write_data(tmp_path / "dev.jsonl", 8, seed=2),
    }


def test_finished_run_summary_matches_the_files_written(data, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*command(data, out), "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    metrics = json.loads((out / "metrics.json").read_text())
    assert summary["task"] == "toy" and summary["status"] == "finished" and summary["out"] == str(out)
    assert summary["step"] == summary["total_steps"] == STEPS
    assert summary["dev_metrics"] == metrics["metrics"] and set(summary["dev_metrics"]) == {"accuracy"}
    assert summary["checkpoint"].startswith(str(out / "checkpoints"))
    assert summary["files"] == {"options": str(out / "train_options.json"), "log": str(out / "train_log.jsonl"),
                                "metrics": str(out / "metrics.json"),
                                "dev_predictions": str(out / "dev_predictions.json")}
    assert f"after {STEPS} steps" in captured.err  # the human line stays on stderr


def test_interrupted_run_summary_names_the_checkpoint(data, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(toy_task, "collate", toy_task.collate_interrupting_at(3))  # during step 3
    out = tmp_path / "out"
    assert main([*command(data, out), "--json"]) == 130
    summary = json.loads(capsys.readouterr().out)
    assert (summary["status"], summary["step"], summary["total_steps"]) == ("interrupted", 3, STEPS)
    assert summary["checkpoint"] == str(out / "checkpoints" / "step-000000003") and summary["dev_metrics"] == {}
    assert "metrics" not in summary["files"]
