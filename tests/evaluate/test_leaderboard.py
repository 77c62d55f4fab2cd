"""metrics.json records and the per-task leaderboard built from them."""

import json
from datetime import datetime

import pytest

from longdoc import cli
from longdoc.errors import InputError
from longdoc.evaluate.leaderboard import (
    build_leaderboards, find_runs, leaderboards_json, read_metrics_json, write_metrics_json,
)


def _hotpot_run(root, name, joint_f1, f1):
    return write_metrics_json(root / name, task="hotpotqa", split="dev", model=name, config={"lr": 3e-5},
                              metrics={"f1": f1, "joint_f1": joint_f1})


def test_write_and_read_back(tmp_path):
    path = write_metrics_json(tmp_path / "run", task="openkp", split="dev", model="m", config={"seed": 1},
                              metrics={"F1@3": 0.25, "P@3": 0.5})
    assert path == tmp_path / "run" / "metrics.json"
    record = json.loads(path.read_text())
    assert list(record) == ["task", "split", "model", "config", "date", "metrics"]
    assert datetime.fromisoformat(record["date"]).tzinfo is not None
    run = read_metrics_json(path)
    assert (run.task, run.split, run.model, run.config, run.metrics) == ("openkp", "dev", "m", {"seed": 1},
                                                                          {"F1@3": 0.25, "P@3": 0.5})


@pytest.mark.parametrize("record, message", [
    ({"task": "squad", "date": "d", "metrics": {"f1": 1.0}}, "unknown task 'squad'"),
    ({"task": "wikihop", "date": "d"}, "missing field 'metrics'"),
    ({"task": "wikihop", "date": "d", "metrics": {"accuracy": "0.5"}}, "metric 'accuracy' must be a finite number"),
    ({"task": "wikihop", "date": "d", "metrics": {"accuracy": 0.5}, "model": 3}, "'model' must be text or null"),
])
def test_bad_records_name_file_and_field(tmp_path, record, message):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(record))
    with pytest.raises(InputError, match=message) as error:
        read_metrics_json(path)
    assert str(path) in str(error.value)


def test_write_refuses_unknown_task_and_non_numbers(tmp_path):
    with pytest.raises(InputError, match="unknown task"):
        write_metrics_json(tmp_path, task="squad", split=None, model=None, config=None, metrics={"f1": 1.0})
    with pytest.raises(InputError, match="must be a finite number"):
        write_metrics_json(tmp_path, task="wikihop", split=None, model=None, config=None, metrics={"accuracy": None})
    assert not (tmp_path / "metrics.json").exists()


def test_find_runs_searches_folders_recursively(tmp_path):
    _hotpot_run(tmp_path / "a", "x", 0.5, 0.6)
    _hotpot_run(tmp_path / "b" / "deeper", "y", 0.5, 0.6)
    assert sorted(run.model for run in find_runs([tmp_path])) == ["x", "y"]
    assert [run.model for run in find_runs([tmp_path / "a" / "x" / "metrics.json"])] == ["x"]
    with pytest.raises(FileNotFoundError):
        find_runs([tmp_path / "absent"])


def test_rows_sorted_by_headline_with_marked_reference_rows(tmp_path):
    _hotpot_run(tmp_path, "weak", joint_f1=0.70, f1=0.80)
    _hotpot_run(tmp_path, "strong", joint_f1=0.75, f1=0.85)
    [board] = build_leaderboards(find_runs([tmp_path]))
    assert board.task == "hotpotqa" and board.headline_metric == "joint_f1"
    # 0.75 run, RealFormer 0.7357, ETC-large 0.7312, 0.70 run; the ETC paper row published no joint F1: last.
    order = [(row.model, row.reference, row.metrics.get("joint_f1")) for row in board.rows]
    assert order == [
        ("strong", False, 0.75), ("ETC-large + RealFormer", True, 0.7357), ("ETC-large", True, 0.7312),
        ("weak", False, 0.70), ("ETC-large", True, None),
    ]
    assert board.columns == ["joint_f1", "f1", "sp_f1"]


def test_markdown_marks_references_and_leaves_unpublished_cells_empty(tmp_path):
    _hotpot_run(tmp_path, "strong", joint_f1=0.756789, f1=0.85)
    [board] = build_leaderboards(find_runs([tmp_path]))
    lines = board.to_markdown().splitlines()
    assert lines[0] == "### hotpotqa (sorted by joint_f1)"
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    header, rows = cells[0], cells[2:]
    assert header == ["model", "split", "joint_f1", "f1", "sp_f1", "date", "source"]
    # Four decimals in the table (0.756789 -> 0.7568); the run has no sp_f1: empty.
    assert rows[0][:5] == ["strong", "dev", "0.7568", "0.85", ""]
    # The ETC paper row: no joint F1 published, its f1 and sp_f1 shown as published (no invented digits).
    assert rows[-1][:5] == ["ETC-large [reference]", "dev", "", "0.813", "0.894"]
    assert rows[-1][6] == "ETC paper (Ainslie et al., 2020), dev"


def test_json_keeps_every_digit_and_columns_can_be_chosen(tmp_path):
    write_metrics_json(tmp_path / "w", task="wikihop", split="dev", model="w", config=None,
                       metrics={"accuracy": 2 / 3})
    _hotpot_run(tmp_path, "h", joint_f1=0.5, f1=0.6)
    # Chosen columns apply to every table, each keeping those its rows report.
    boards = build_leaderboards(find_runs([tmp_path]), columns=["f1", "accuracy", "joint_f1"])
    document = json.loads(leaderboards_json(boards))
    assert list(document) == ["hotpotqa", "wikihop"]  # registry order; tasks without runs left out
    assert document["hotpotqa"]["columns"] == ["joint_f1", "f1"]
    assert document["wikihop"]["columns"] == ["accuracy"]
    [run_row] = [row for row in document["wikihop"]["rows"] if not row["reference"]]
    assert run_row["metrics"] == {"accuracy": 2 / 3}
    assert sum(row["reference"] for row in document["wikihop"]["rows"]) == 3


@pytest.fixture
def only_our_commands(monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", {"leaderboard": "longdoc.commands.leaderboard"})


def test_cli_prints_tables(tmp_path, capsys, only_our_commands):
    _hotpot_run(tmp_path, "strong", joint_f1=0.75, f1=0.85)
    assert cli.main(["leaderboard", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### hotpotqa (sorted by joint_f1)")
    assert "| ETC-large + RealFormer [reference] |" in out
    assert cli.main(["leaderboard", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hotpotqa"]["headline_metric"] == "joint_f1"


def test_cli_errors(tmp_path, capsys, only_our_commands):
    assert cli.main(["leaderboard", str(tmp_path)]) == 2
    assert "no metrics.json found" in capsys.readouterr().err
    (tmp_path / "metrics.json").write_text('{"task": "wikihop",\n oops}')
    assert cli.main(["leaderboard", str(tmp_path)]) == 2
    assert "metrics.json:2:" in capsys.readouterr().err
