"""`longdoc evaluate` through the real entry point (longdoc.cli.main): output, flags, errors, --out."""

import argparse
import hashlib
import json

import pytest

from longdoc import cli
from longdoc.commands import evaluate as evaluate_command
from longdoc.errors import InputError

HOTPOT = "hotpotqa/hotpot_dev_distractor_v1.first53.json"
WIKIHOP = "wikihop/wikihop_dev.first28.json"
OPENKP_GOLD = "openkp/eval_reference_example.jsonl"
OPENKP_PRED = "openkp/eval_candidate_example.jsonl"
NQ_GOLD = "natural_questions/simplified-nq-train.sample2.jsonl"


@pytest.fixture(autouse=True)
def only_our_commands(monkeypatch):
    # The parser imports every command module; keep these tests to the commands they are about.
    monkeypatch.setattr(cli, "COMMANDS", {"evaluate": "longdoc.commands.evaluate",
                                          "leaderboard": "longdoc.commands.leaderboard"})


def _write(path, value):
    path.write_text(json.dumps(value))
    return path


@pytest.fixture
def hotpot_self_prediction(shared_data, tmp_path):
    gold = json.loads((shared_data / HOTPOT).read_text())
    return _write(tmp_path / "hotpot_pred.json", {"answer": {e["_id"]: e["answer"] for e in gold},
                                                  "sp": {e["_id"]: e["supporting_facts"] for e in gold}})


def test_json_output_is_one_object_with_official_keys(shared_data, capsys):
    status = cli.main(["evaluate", "openkp", "--gold", str(shared_data / OPENKP_GOLD),
                       "--pred", str(shared_data / OPENKP_PRED), "--json"])
    assert status == 0
    printed = json.loads(capsys.readouterr().out)
    # The README pair: @1 F1 0; @3 P = R = F1 = 2/3; @5 P 0.4, R 2/3, F1 0.5 (every digit kept).
    assert printed == {"F1@1": 0.0, "P@1": 0.0, "R@1": 0.0,
                       "F1@3": 2 / 3, "P@3": 2 / 3, "R@3": 2 / 3,
                       "F1@5": 0.5, "P@5": 0.4, "R@5": 2 / 3}


def test_table_output_lists_every_metric(shared_data, hotpot_self_prediction, capsys):
    assert cli.main(["evaluate", "hotpotqa", "--gold", str(shared_data / HOTPOT), "--pred", str(hotpot_self_prediction)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["|", "metric", "|", "value", "|"]
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in lines[2:]}
    assert rows["joint_f1"] == "1.0" and rows["rougeL_f1"] == "1.0" and len(rows) == 15


def test_wikihop_gold_against_itself(shared_data, tmp_path, capsys):
    gold = json.loads((shared_data / WIKIHOP).read_text())
    pred = _write(tmp_path / "pred.json", {e["id"]: e["answer"] for e in gold})
    assert cli.main(["evaluate", "wikihop", "--gold", str(shared_data / WIKIHOP), "--pred", str(pred), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"accuracy": 1.0}


def test_missing_predictions_are_an_error_naming_them(shared_data, tmp_path, capsys):
    gold = json.loads((shared_data / WIKIHOP).read_text())
    pred = _write(tmp_path / "pred.json", {e["id"]: e["answer"] for e in gold[:20]})
    status = cli.main(["evaluate", "wikihop", "--gold", str(shared_data / WIKIHOP), "--pred", str(pred), "--json"])
    assert status == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    missing = sorted(e["id"] for e in gold[20:])
    assert (f"8 gold id(s) have no prediction: {', '.join(map(repr, missing[:5]))} and 3 more; give --allow-missing"
            in captured.err)


def test_allow_missing_scores_missing_predictions_zero_with_a_warning(shared_data, tmp_path, capsys):
    gold = json.loads((shared_data / WIKIHOP).read_text())
    pred = _write(tmp_path / "pred.json", {e["id"]: e["answer"] for e in gold[:20]})
    with pytest.warns(UserWarning, match="wikihop: 8 of 28 gold questions have no prediction"):
        status = cli.main(["evaluate", "wikihop", "--gold", str(shared_data / WIKIHOP), "--pred", str(pred), "--json",
                           "--allow-missing"])
    assert status == 0
    assert json.loads(capsys.readouterr().out) == {"accuracy": 20 / 28}


# task -> (gold under shared/data, metric flags): multihop is scored by HotpotQA's metric on its format.
ID_RULE_TASKS = {"hotpotqa": (HOTPOT, []), "multihop": (HOTPOT, []), "wikihop": (WIKIHOP, []),
                 "nq": (NQ_GOLD, ["--long-non-null-threshold", "1", "--short-non-null-threshold", "1"]),
                 "openkp": (OPENKP_GOLD, [])}


def _with_wrong_ids(task, shared_data, folder):
    """A perfect prediction file for the task's gold sample, every example id changed to one the gold lacks."""
    from tests.tasks.predictions import MAKERS

    maker = MAKERS["hotpotqa" if task == "multihop" else task][1]
    gold = shared_data / ID_RULE_TASKS[task][0]
    pred = maker(gold, folder / f"{task}-pred.json", False)
    if task == "openkp":
        records = [json.loads(line) for line in pred.read_text().splitlines()]
        pred.write_text("".join(json.dumps({**r, "url": "wrong-" + r["url"]}) + "\n" for r in records))
    elif task == "nq":
        records = json.loads(pred.read_text())["predictions"]
        _write(pred, {"predictions": [{**r, "example_id": r["example_id"] + 1} for r in records]})
    elif task == "wikihop":
        _write(pred, {"wrong-" + key: value for key, value in json.loads(pred.read_text()).items()})
    else:
        parts = json.loads(pred.read_text())
        _write(pred, {part: {"wrong-" + key: value for key, value in parts[part].items()} for part in parts})
    return gold, pred


@pytest.mark.parametrize("task", list(ID_RULE_TASKS))
def test_every_task_refuses_predictions_whose_ids_match_no_gold_id(task, shared_data, tmp_path, capsys):
    gold, pred = _with_wrong_ids(task, shared_data, tmp_path)
    flags = ID_RULE_TASKS[task][1]
    assert cli.main(["evaluate", task, "--gold", str(gold), "--pred", str(pred), "--json", *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"longdoc evaluate: error: {pred} does not predict the examples of {gold}: " in captured.err
    assert " predicted id(s) match no gold id: " in captured.err
    assert "--allow-missing" in captured.err and len(captured.err.splitlines()) == 1


@pytest.mark.parametrize("task", list(ID_RULE_TASKS))
def test_allow_missing_scores_as_the_official_script_does(task, shared_data, tmp_path, capsys):
    gold, pred = _with_wrong_ids(task, shared_data, tmp_path)
    argv = ["evaluate", task, "--gold", str(gold), "--pred", str(pred), "--json", "--allow-missing",
            *ID_RULE_TASKS[task][1]]
    if task in ("nq", "openkp"):  # their official scripts refuse such a file
        assert cli.main(argv) == 2
        assert "scores only a file with exactly the gold's ids, so --allow-missing does not apply" in (
            capsys.readouterr().err)
        return
    with pytest.warns(UserWarning) as caught:
        assert cli.main(argv) == 0
    assert set(json.loads(capsys.readouterr().out).values()) == {0.0}
    messages = [str(warning.message) for warning in caught]
    assert messages and all(message.startswith(f"{task}: ") for message in messages), messages
    assert any("predicted ids are not in the gold file" in message for message in messages)


def test_nq_thresholds_are_refused_for_other_tasks(shared_data, tmp_path, capsys):
    status = cli.main(["evaluate", "wikihop", "--gold", str(shared_data / WIKIHOP), "--pred", str(tmp_path / "p.json"),
                       "--short-non-null-threshold", "3"])
    assert status == 2
    assert "--short-non-null-threshold does not apply to the wikihop task" in capsys.readouterr().err


def _parse(argv):
    parser = argparse.ArgumentParser()
    evaluate_command.add_arguments(parser)
    return parser.parse_args(argv)


def test_nq_thresholds_default_to_two_and_pass_through():
    common = ["--gold", "g", "--pred", "p"]
    assert evaluate_command.task_metric_options(_parse(["nq", *common])) == {
        "long_non_null_threshold": 2, "short_non_null_threshold": 2}
    assert evaluate_command.task_metric_options(_parse(["nq", *common, "--long-non-null-threshold", "3"])) == {
        "long_non_null_threshold": 3, "short_non_null_threshold": 2}
    assert evaluate_command.task_metric_options(_parse(["openkp", *common])) == {}
    with pytest.raises(InputError, match="--long-non-null-threshold does not apply to the openkp task"):
        evaluate_command.task_metric_options(_parse(["openkp", *common, "--long-non-null-threshold", "2"]))


def test_malformed_json_is_a_clean_error(shared_data, tmp_path, capsys):
    pred = tmp_path / "pred.json"
    pred.write_text('{"answer": {}\n"sp": {}}')
    status = cli.main(["evaluate", "hotpotqa", "--gold", str(shared_data / HOTPOT), "--pred", str(pred)])
    assert status == 2
    assert f"longdoc evaluate: error: {pred}:2:1: not valid JSON" in capsys.readouterr().err


def test_keyphrase_strings_are_a_clean_error(shared_data, tmp_path, capsys):
    pred = tmp_path / "pred.jsonl"
    pred.write_text(json.dumps({"url": "http://1hackerstock.blogspot.com/2016/09/nba-2k17-cd-key-generator-no-survey-pc.html",
                                "KeyPhrases": ["NBA", "Key Generator", "Xbox"]}) + "\n")
    assert cli.main(["evaluate", "openkp", "--gold", str(shared_data / OPENKP_GOLD), "--pred", str(pred)]) == 2
    assert "keyphrase 0 is a string ('NBA'), not a token list" in capsys.readouterr().err


def test_missing_field_is_a_clean_error(shared_data, tmp_path, capsys):
    pred = _write(tmp_path / "pred.json", {"answer": {}})
    assert cli.main(["evaluate", "hotpotqa", "--gold", str(shared_data / HOTPOT), "--pred", str(pred)]) == 2
    assert "the prediction has no 'sp' field" in capsys.readouterr().err


def test_missing_file_is_a_clean_error(tmp_path, capsys):
    status = cli.main(["evaluate", "wikihop", "--gold", str(tmp_path / "absent.json"), "--pred", str(tmp_path / "p.json")])
    assert status == 2
    assert "absent.json" in capsys.readouterr().err


def test_out_writes_metrics_json(shared_data, hotpot_self_prediction, tmp_path, capsys):
    out = tmp_path / "run"
    status = cli.main(["evaluate", "hotpotqa", "--gold", str(shared_data / HOTPOT), "--pred", str(hotpot_self_prediction),
                       "--json", "--out", str(out), "--split", "dev", "--model", "oracle"])
    assert status == 0
    printed = json.loads(capsys.readouterr().out)
    record = json.loads((out / "metrics.json").read_text())
    assert record["task"] == "hotpotqa" and record["split"] == "dev" and record["model"] == "oracle"
    assert record["metrics"] == printed
    assert record["config"] == {"gold": str((shared_data / HOTPOT).resolve()), "pred": str(hotpot_self_prediction.resolve())}
    assert record["date"]
    gold = shared_data / HOTPOT
    assert record["examples"] == 53
    assert record["gold"] == {"files": [gold.name], "bytes": gold.stat().st_size,
                              "sha256": hashlib.sha256(gold.read_bytes()).hexdigest()}


def test_a_perfect_prediction_on_the_sample_does_not_rank_with_the_published_rows(shared_data, hotpot_self_prediction,
                                                                                  tmp_path, capsys):
    gold = shared_data / HOTPOT
    for name, split in (("oracle", "dev"), ("oracle-no-split", None)):
        argv = ["evaluate", "hotpotqa", "--gold", str(gold), "--pred", str(hotpot_self_prediction),
                "--out", str(tmp_path / "runs" / name), "--model", name]
        assert cli.main(argv + (["--split", split] if split else [])) == 0
    capsys.readouterr()
    assert cli.main(["leaderboard", str(tmp_path / "runs"), "--json"]) == 0
    groups = json.loads(capsys.readouterr().out)["hotpotqa"]["groups"]
    published, on_sample, without_split = groups
    assert [row["model"] for row in published["rows"]] == ["ETC-large + RealFormer", "ETC-large", "ETC-large"]
    assert published["title"].startswith("full dev (7405 examples")
    [oracle] = on_sample["rows"]
    assert (oracle["model"], oracle["rank"], oracle["examples"], oracle["metrics"]["joint_f1"]) == ("oracle", 1, 53, 1.0)
    assert on_sample["title"].startswith(f"split dev, gold {gold.name}: 53 examples")
    [no_split] = without_split["rows"]
    assert (no_split["model"], no_split["split"]) == ("oracle-no-split", None)
    assert without_split["title"].startswith("split not recorded (ranked apart from dev runs)")


def test_split_without_out_is_refused(capsys, tmp_path):
    status = cli.main(["evaluate", "wikihop", "--gold", "g", "--pred", "p", "--split", "dev"])
    assert status == 2
    assert "give --out DIR too" in capsys.readouterr().err
