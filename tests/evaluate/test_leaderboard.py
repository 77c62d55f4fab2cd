"""metrics.json records and the per-task leaderboard built from them: runs ranked only against runs
scored on the same gold, the published figures apart, old records shown but never ranked."""

import gzip
import hashlib
import json
import shutil
from datetime import datetime

import pytest

from longdoc import cli
from longdoc.errors import InputError
from longdoc.tasks import REGISTRY
from longdoc.evaluate.leaderboard import (
    build_leaderboards, find_runs, gold_identity, leaderboards_json, read_metrics_json, write_metrics_json,
)

HOTPOT_SAMPLE = "hotpotqa/hotpot_dev_distractor_v1.first53.json"
WIKIHOP_SAMPLE = "wikihop/wikihop_dev.first28.json"
NQ_SAMPLE = "natural_questions/simplified-nq-train.sample2.jsonl"
OPENKP_GOLD = "openkp/eval_reference_example.jsonl"


def _sha256(*paths):
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _hotpot_run(root, name, gold, joint_f1, f1, split="dev"):
    return write_metrics_json(root / name, task="hotpotqa", split=split, model=name, config={"lr": 3e-5},
                              metrics={"f1": f1, "joint_f1": joint_f1}, gold=gold)


@pytest.fixture
def full_dev_lookalike(tmp_path):
    """A file with the official HotpotQA dev file's name and question count (its content is not the
    official one: only the name and the count are compared, as the published hashes are unknown)."""
    path = tmp_path / "official" / "hotpot_dev_distractor_v1.json"
    path.parent.mkdir()
    path.write_text(json.dumps([{"_id": str(number)} for number in range(7405)]))
    return path


def test_write_records_examples_and_gold_identity(shared_data, tmp_path):
    gold = shared_data / OPENKP_GOLD
    path = write_metrics_json(tmp_path / "run", task="openkp", split="dev", model="m", config={"seed": 1},
                              metrics={"F1@3": 0.25, "P@3": 0.5}, gold=gold)
    assert path == tmp_path / "run" / "metrics.json"
    record = json.loads(path.read_text())
    assert list(record) == ["task", "split", "model", "config", "date", "examples", "gold", "metrics"]
    assert datetime.fromisoformat(record["date"]).tzinfo is not None
    assert record["examples"] == 1
    assert record["gold"] == {"files": ["eval_reference_example.jsonl"], "bytes": gold.stat().st_size,
                              "sha256": _sha256(gold)}
    run = read_metrics_json(path, REGISTRY)
    assert (run.task, run.split, run.model, run.config, run.metrics) == ("openkp", "dev", "m", {"seed": 1},
                                                                          {"F1@3": 0.25, "P@3": 0.5})
    assert (run.examples, run.gold) == (1, record["gold"])


def test_gold_identity_counts_json_lists_json_lines_gzip_and_shards(shared_data, tmp_path):
    assert gold_identity(shared_data / HOTPOT_SAMPLE)[0] == 53
    assert gold_identity(shared_data / WIKIHOP_SAMPLE)[0] == 28
    assert gold_identity(shared_data / NQ_SAMPLE)[0] == 2
    packed = tmp_path / "nq-dev-00.jsonl.gz"
    packed.write_bytes(gzip.compress((shared_data / NQ_SAMPLE).read_bytes()))
    # The hash and size are the file's own bytes (compressed), the count the records inside.
    assert gold_identity(packed) == (2, {"files": [packed.name], "bytes": packed.stat().st_size,
                                         "sha256": _sha256(packed)})
    second = tmp_path / "nq-dev-01.jsonl.gz"
    shutil.copy(packed, second)
    examples, identity = gold_identity(tmp_path / "nq-dev-0*.jsonl.gz")
    assert examples == 4 and identity["files"] == ["nq-dev-00.jsonl.gz", "nq-dev-01.jsonl.gz"]
    assert identity["sha256"] == _sha256(packed, second)
    with pytest.raises(FileNotFoundError, match="no gold file"):
        gold_identity(tmp_path / "nq-test-*.jsonl.gz")


@pytest.mark.parametrize("record, message", [
    ({"task": "squad", "date": "d", "metrics": {"f1": 1.0}}, "unknown task 'squad'"),
    ({"task": "wikihop", "date": "d"}, "missing field 'metrics'"),
    ({"task": "wikihop", "date": "d", "metrics": {"accuracy": "0.5"}}, "metric 'accuracy' must be a finite number"),
    ({"task": "wikihop", "date": "d", "metrics": {"accuracy": 0.5}, "model": 3}, "'model' must be text or null"),
    ({"task": "wikihop", "date": "d", "metrics": {"accuracy": 0.5}, "examples": "28"}, "'examples' must be a positive"),
    ({"task": "wikihop", "date": "d", "metrics": {"accuracy": 0.5}, "gold": {"files": ["dev.json"], "bytes": 9}},
     "'gold' must be"),
])
def test_bad_records_name_file_and_field(tmp_path, record, message):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(record))
    with pytest.raises(InputError, match=message) as error:
        read_metrics_json(path, REGISTRY)
    assert str(path) in str(error.value)


def test_write_refuses_non_numbers_and_missing_gold(shared_data, tmp_path):
    # (the task name comes from a task record; a file naming an unknown task is refused when read)
    gold = shared_data / WIKIHOP_SAMPLE
    with pytest.raises(InputError, match="must be a finite number"):
        write_metrics_json(tmp_path, task="wikihop", split=None, model=None, config=None, metrics={"accuracy": None},
                           gold=gold)
    with pytest.raises(FileNotFoundError, match="absent.json"):
        write_metrics_json(tmp_path, task="wikihop", split=None, model=None, config=None, metrics={"accuracy": 1.0},
                           gold=tmp_path / "absent.json")
    assert not (tmp_path / "metrics.json").exists()


def test_find_runs_searches_folders_recursively(shared_data, tmp_path):
    gold = shared_data / HOTPOT_SAMPLE
    _hotpot_run(tmp_path / "a", "x", gold, 0.5, 0.6)
    _hotpot_run(tmp_path / "b" / "deeper", "y", gold, 0.5, 0.6)
    assert sorted(run.model for run in find_runs([tmp_path], REGISTRY)) == ["x", "y"]
    assert [run.model for run in find_runs([tmp_path / "a" / "x" / "metrics.json"], REGISTRY)] == ["x"]
    with pytest.raises(FileNotFoundError):
        find_runs([tmp_path / "absent"], REGISTRY)


def _rows(group):
    return [(row.rank, row.model, row.reference, row.metrics.get("joint_f1")) for row in group.rows]


def test_a_perfect_run_on_the_sample_stays_apart_from_the_published_rows(shared_data, tmp_path):
    sample = shared_data / HOTPOT_SAMPLE
    _hotpot_run(tmp_path, "perfect", sample, joint_f1=1.0, f1=1.0)
    _hotpot_run(tmp_path, "weak", sample, joint_f1=0.20, f1=0.30)
    [board] = build_leaderboards(find_runs([tmp_path], REGISTRY), REGISTRY)
    published, on_sample = board.groups
    # The published rows rank among themselves; the ETC paper row published no joint F1: last, unranked.
    assert published.title.startswith("full dev (7405 examples, hotpot_dev_distractor_v1.json)")
    assert _rows(published) == [(1, "ETC-large + RealFormer", True, 0.7357), (2, "ETC-large", True, 0.7312),
                                (None, "ETC-large", True, None)]
    assert all(row.examples == 7405 and row.gold == "full dev" for row in published.rows)
    assert on_sample.title == (f"split dev, gold hotpot_dev_distractor_v1.first53.json: 53 examples, "
                               f"sha256 {_sha256(sample)[:12]}")
    assert _rows(on_sample) == [(1, "perfect", False, 1.0), (2, "weak", False, 0.20)]
    assert all(row.examples == 53 for row in on_sample.rows)


def test_runs_on_the_published_set_rank_among_the_published_rows(shared_data, full_dev_lookalike, tmp_path):
    _hotpot_run(tmp_path / "runs", "full", full_dev_lookalike, joint_f1=0.7340, f1=0.8)
    _hotpot_run(tmp_path / "runs", "no-split", full_dev_lookalike, joint_f1=0.90, f1=0.9, split=None)
    [board] = build_leaderboards(find_runs([tmp_path / "runs"], REGISTRY), REGISTRY)
    published, unknown_split = board.groups
    assert _rows(published) == [(1, "ETC-large + RealFormer", True, 0.7357), (2, "full", False, 0.7340),
                                (3, "ETC-large", True, 0.7312), (None, "ETC-large", True, None)]
    # Same file, but no split recorded: ranked apart, never among the dev rows.
    assert unknown_split.title.startswith("split not recorded (ranked apart from dev runs), gold "
                                          "hotpot_dev_distractor_v1.json: 7405 examples")
    assert _rows(unknown_split) == [(1, "no-split", False, 0.90)]


def test_same_file_name_with_another_count_is_not_the_published_set(tmp_path):
    gold = tmp_path / "hotpot_dev_distractor_v1.json"
    gold.write_text(json.dumps([{"_id": str(number)} for number in range(7404)]))
    _hotpot_run(tmp_path / "runs", "cut", gold, joint_f1=0.99, f1=0.99)
    [board] = build_leaderboards(find_runs([tmp_path / "runs"], REGISTRY), REGISTRY)
    assert [row.model for row in board.groups[0].rows if not row.reference] == []
    assert _rows(board.groups[1]) == [(1, "cut", False, 0.99)]


def test_runs_on_different_gold_files_are_never_ranked_together(shared_data, tmp_path):
    sample = shared_data / HOTPOT_SAMPLE
    edited = tmp_path / "gold" / sample.name  # the same name, one question dropped
    edited.parent.mkdir()
    edited.write_text(json.dumps(json.loads(sample.read_text())[1:]))
    _hotpot_run(tmp_path / "runs", "a", sample, joint_f1=0.5, f1=0.5)
    _hotpot_run(tmp_path / "runs", "b", edited, joint_f1=0.6, f1=0.6)
    [board] = build_leaderboards(find_runs([tmp_path / "runs"], REGISTRY), REGISTRY)
    # Each run is first in a group of its own (groups of one name ordered by hash).
    assert sorted(_rows(group) + [group.rows[0].examples] for group in board.groups[1:]) == [
        [(1, "a", False, 0.5), 53], [(1, "b", False, 0.6), 52]]


def test_runs_on_a_gold_derived_from_another_rank_in_its_table_marked(shared_data, tmp_path):
    sample = shared_data / HOTPOT_SAMPLE
    cut = tmp_path / "gold" / "dev-first512.json"  # the same questions, each changed the same way
    cut.parent.mkdir()
    cut.write_text(json.dumps([{**example, "context": example["context"][:2]}
                               for example in json.loads(sample.read_text())]))
    _hotpot_run(tmp_path / "runs", "whole", sample, joint_f1=0.5, f1=0.5)
    write_metrics_json(tmp_path / "runs" / "cut", task="hotpotqa", split="dev", model="cut", config={},
                       metrics={"f1": 0.7, "joint_f1": 0.6}, gold=cut,
                       derived_from=(sample, "each example cut to its first 2 paragraphs"))
    [board] = build_leaderboards(find_runs([tmp_path / "runs"], REGISTRY), REGISTRY)
    [group] = board.groups[1:]  # one table: the sample's, with the run on the cut beside the whole one
    assert _rows(group) == [(1, "cut", False, 0.6), (2, "whole", False, 0.5)]
    assert "with the runs on golds derived from it, marked" in group.title
    assert group.rows[0].gold.endswith(", derived: each example cut to its first 2 paragraphs")
    assert ", derived: " not in group.rows[1].gold
    with pytest.raises(InputError, match="a derived gold holds the same examples"):
        write_metrics_json(tmp_path / "runs" / "fewer", task="hotpotqa", split="dev", model="x", config={},
                           metrics={"f1": 0.1, "joint_f1": 0.1}, gold=cut, derived_from=(shared_data / WIKIHOP_SAMPLE,
                                                                                         "not the same examples"))


def test_old_records_are_shown_flagged_and_never_ranked(shared_data, tmp_path):
    _hotpot_run(tmp_path, "identified", shared_data / HOTPOT_SAMPLE, joint_f1=0.3, f1=0.4)
    old = tmp_path / "old" / "metrics.json"
    old.parent.mkdir()
    old.write_text(json.dumps({"task": "hotpotqa", "split": "dev", "model": "old", "config": None,
                               "date": "2026-01-01T00:00:00+00:00", "metrics": {"joint_f1": 0.99, "f1": 0.99}}))
    [board] = build_leaderboards(find_runs([tmp_path], REGISTRY), REGISTRY)
    unranked = board.groups[-1]
    assert not unranked.ranked and unranked.title.startswith("not ranked: metrics.json without the gold's identity")
    assert _rows(unranked) == [(None, "old", False, 0.99)]
    assert [row.model for group in board.groups[:-1] for row in group.rows if not row.reference] == ["identified"]
    last_row = board.to_markdown().splitlines()[-1]
    assert [cell.strip() for cell in last_row.strip("|").split("|")][:6] == ["", "old", "dev", "", "not recorded", "0.99"]


def test_markdown_shows_rank_examples_gold_and_empty_unpublished_cells(shared_data, tmp_path):
    sample = shared_data / HOTPOT_SAMPLE
    _hotpot_run(tmp_path, "strong", sample, joint_f1=0.756789, f1=0.85)
    [board] = build_leaderboards(find_runs([tmp_path], REGISTRY), REGISTRY)
    sections = board.to_markdown().split("\n\n")
    assert sections[0] == "### hotpotqa (sorted by joint_f1; ranked within each gold set only)"
    assert sections[1].startswith("#### full dev (7405 examples")
    assert sections[3] == (f"#### split dev, gold hotpot_dev_distractor_v1.first53.json: 53 examples, "
                           f"sha256 {_sha256(sample)[:12]}")

    def cells(table):
        return [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()]

    published, run = cells(sections[2]), cells(sections[4])
    assert published[0] == ["rank", "model", "split", "examples", "gold", "joint_f1", "f1", "sp_f1", "date", "source"]
    assert published[2][:5] == ["1", "ETC-large + RealFormer [reference]", "dev", "7405", "full dev"]
    # The ETC paper row: no joint F1 published (no rank), its f1 and sp_f1 as published (no invented digits).
    assert published[-1][:8] == ["", "ETC-large [reference]", "dev", "7405", "full dev", "", "0.813", "0.894"]
    assert published[-1][9] == "ETC paper (Ainslie et al., 2020), dev"
    # Four decimals in the table (0.756789 -> 0.7568); the run has no sp_f1: empty.
    assert run[2][:8] == ["1", "strong", "dev", "53", f"{sample.name} (sha256 {_sha256(sample)[:12]})", "0.7568",
                          "0.85", ""]


def test_json_keeps_every_digit_and_columns_can_be_chosen(shared_data, tmp_path):
    write_metrics_json(tmp_path / "w", task="wikihop", split="dev", model="w", config=None,
                       metrics={"accuracy": 2 / 3}, gold=shared_data / WIKIHOP_SAMPLE)
    _hotpot_run(tmp_path, "h", shared_data / HOTPOT_SAMPLE, joint_f1=0.5, f1=0.6)
    # Chosen columns apply to every table, each keeping those its rows report.
    boards = build_leaderboards(find_runs([tmp_path], REGISTRY), REGISTRY, columns=["f1", "accuracy", "joint_f1"])
    document = json.loads(leaderboards_json(boards))
    assert list(document) == ["hotpotqa", "wikihop"]  # registry order; tasks without runs left out
    assert document["hotpotqa"]["columns"] == ["joint_f1", "f1"]
    assert document["wikihop"]["columns"] == ["accuracy"]
    published, on_sample = document["wikihop"]["groups"]
    assert published["ranked"] and len(published["rows"]) == 3 and all(row["reference"] for row in published["rows"])
    [run_row] = on_sample["rows"]
    assert run_row["metrics"] == {"accuracy": 2 / 3}
    assert (run_row["rank"], run_row["examples"], run_row["split"]) == (1, 28, "dev")


@pytest.fixture
def only_our_commands(monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", {"leaderboard": "longdoc.commands.leaderboard"})


def test_cli_prints_tables(shared_data, tmp_path, capsys, only_our_commands):
    _hotpot_run(tmp_path, "strong", shared_data / HOTPOT_SAMPLE, joint_f1=0.75, f1=0.85)
    assert cli.main(["leaderboard", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### hotpotqa (sorted by joint_f1; ranked within each gold set only)")
    assert "| 1    | ETC-large + RealFormer [reference] |" in out
    assert cli.main(["leaderboard", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hotpotqa"]["headline_metric"] == "joint_f1"


def test_cli_errors(tmp_path, capsys, only_our_commands):
    assert cli.main(["leaderboard", str(tmp_path)]) == 2
    assert "no metrics.json found" in capsys.readouterr().err
    (tmp_path / "metrics.json").write_text('{"task": "wikihop",\n oops}')
    assert cli.main(["leaderboard", str(tmp_path)]) == 2
    assert "metrics.json:2:" in capsys.readouterr().err
