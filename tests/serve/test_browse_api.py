"""The prediction browser's API (`longdoc serve --task`) on a real server, for each task's real sample:
its totals are what `longdoc evaluate --json` prints for the same files, every example is listed and
served in full, an unknown id is 404, the leaderboard's rows link to their runs."""

import json
import urllib.parse
import warnings

import pytest

from longdoc.cli import main
from tests.serve.conftest import request, running
from tests.tasks.predictions import MAKERS, prediction_files


def _evaluate_json(task, gold, pred, options, capsys) -> dict:
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in options.items()] + ["--allow-missing"]
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["evaluate", task, "--gold", str(gold), "--pred", str(pred), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def _browser(task, gold, preds, options, run_dirs=()):
    from longdoc.serve.app import create_app
    from longdoc.serve.browser import PredictionBrowser
    from longdoc.tasks import REGISTRY

    return create_app(browser=PredictionBrowser(REGISTRY, task, gold, preds, options, run_dirs,
                                                allow_missing=True))


@pytest.mark.parametrize("task", list(MAKERS))
def test_totals_are_evaluates_and_every_example_is_served(task, shared_data, tmp_path, capsys):
    gold, preds, options = prediction_files(task, shared_data, tmp_path)
    with running(_browser(task, gold, preds, options)) as base:
        status, info = request(f"{base}/api/info")
        assert status == 200 and info["mode"] == "browse" and info["task"] == task
        assert [run["totals"] for run in info["runs"]] == [_evaluate_json(task, gold, pred, options, capsys)
                                                           for pred in preds]
        status, listing = request(f"{base}/api/examples")
        examples = listing["examples"]
        assert status == 200 and len(examples) == info["examples"] >= 1
        assert all(len(example["runs"]) == 2 and set(example["runs"][0]["metrics"]) == set(info["metric_keys"])
                   for example in examples)
        for example in examples:
            status, full = request(f"{base}/api/examples/{urllib.parse.quote(example['id'], safe='')}")
            assert status == 200, full
            assert full["id"] == example["id"] and full["runs"] == example["runs"] and full["texts"]
        status, error = request(f"{base}/api/examples/no-such-example")
        assert (status, error["field"]) == (404, "id") and "no-such-example" in error["error"]


def test_the_metrics_warnings_are_the_runs_notes(shared_data, tmp_path):
    gold, preds, options = prediction_files("hotpotqa", shared_data, tmp_path)
    with running(_browser("hotpotqa", gold, preds, options)) as base:
        perturbed, perfect = request(f"{base}/api/info")[1]["runs"]
    assert any("hotpotqa: 1 of 53 gold examples have no predicted answer" in note for note in perturbed["notes"])
    assert perfect["notes"] == []


def test_leaderboard_rows_link_to_their_runs(shared_data, tmp_path, capsys):
    gold, preds, _ = prediction_files("hotpotqa", shared_data, tmp_path)
    for name, pred in zip(("perturbed", "oracle"), preds):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main(["evaluate", "hotpotqa", "--gold", str(gold), "--pred", str(pred), "--allow-missing",
                         "--out", str(tmp_path / "runs" / name), "--split", "dev", "--model", name]) == 0
    (tmp_path / "runs" / "elsewhere").mkdir()  # scored on another gold: shown, not browsable
    other_gold = tmp_path / "other-gold.json"
    other_gold.write_text(json.dumps(json.loads(gold.read_text(encoding="utf-8"))[:10]), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["evaluate", "hotpotqa", "--gold", str(other_gold), "--pred", str(preds[1]), "--allow-missing",
                     "--out", str(tmp_path / "runs" / "elsewhere"), "--split", "dev", "--model", "ten"]) == 0
    # Only the first run given by --pred; the oracle comes from the leaderboard.
    with running(_browser("hotpotqa", gold, preds[:1], {}, [tmp_path / "runs"])) as base:
        info = request(f"{base}/api/info")[1]
    assert [run["name"] for run in info["runs"]] == [preds[0].name, "oracle"]
    rows = {row["model"]: row for group in info["leaderboard"]["groups"] for row in group["rows"]}
    assert rows["perturbed"]["run"] == 0 and rows["oracle"]["run"] == 1 and rows["ten"]["run"] is None
    assert info["runs"][1]["totals"]["joint_f1"] == rows["oracle"]["metrics"]["joint_f1"] == 1.0


def test_a_prediction_file_the_metric_refuses_is_refused(shared_data, tmp_path):
    from longdoc.errors import InputError
    from longdoc.serve.browser import PredictionBrowser
    from longdoc.tasks import REGISTRY

    gold, preds, options = prediction_files("openkp", shared_data, tmp_path)
    wrong = tmp_path / "other-urls.jsonl"
    wrong.write_text(json.dumps({"url": "http://elsewhere.example/", "KeyPhrases": [["x"]]}) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="1 predicted id.s. match no gold id: .http://elsewhere.example/."):
        PredictionBrowser(REGISTRY, "openkp", gold, [wrong], options)


def _side_records(pred) -> dict:
    from longdoc.data.prediction_scores import scores_path

    return {record["id"]: record for record in map(json.loads, scores_path(pred).read_text().splitlines()[1:])}


@pytest.mark.slow  # `longdoc predict` twice (the session's scored predictions)
def test_the_scores_side_files_scores_are_served(scored_predictions, shared_data, tmp_path):
    gold, pred = scored_predictions["wikihop"]
    _, (_, perfect), _ = prediction_files("wikihop", shared_data, tmp_path)  # no side file
    records = _side_records(pred)
    with running(_browser("wikihop", gold, [pred, perfect], {})) as base:
        for example_id, record in records.items():
            status, full = request(f"{base}/api/examples/{urllib.parse.quote(example_id, safe='')}")
            assert status == 200
            (table,) = full["tables"]
            assert table["columns"] == ["candidate", "gold", "run 1", "run 1 probability", "run 2", "mentions"]
            assert table["bars"] == [3] and table["title"] == "candidates, most probable first"
            probabilities = {c["text"]: c["probability"] for c in record["candidates"]}
            assert [(row[0], float(row[3])) for row in table["rows"]] == sorted(
                ((text, float(f"{p:.4f}")) for text, p in probabilities.items()), key=lambda item: -probabilities[item[0]])
            assert [row[0] for row in table["rows"] if row[1] == "gold"] == [full["gold"]]
            assert [row[0] for row in table["rows"] if row[2] == "chosen"] == [full["runs"][0]["prediction"]]
            assert table["rows"][0][2] == "chosen"  # the most probable candidate is the one chosen
            (_, run_1), (_, run_2) = full["run_fields"][0][1], full["run_fields"][1][1]
            assert run_1 == (f"{full['runs'][0]['prediction']} {probabilities[full['runs'][0]['prediction']]:.1%}; "
                             f"gold {full['gold']} {probabilities[full['gold']]:.1%}")
            assert run_2 == f"no scores: no {perfect.name}.scores.jsonl beside {perfect.name} (`longdoc predict` writes it)"

    gold, pred = scored_predictions["openkp"]
    (record,) = _side_records(pred).values()
    with running(_browser("openkp", gold, [pred], {})) as base:
        full = request(f"{base}/api/examples/{urllib.parse.quote(record['id'], safe='')}")[1]
    (table,) = full["tables"]
    scored = record["keyphrases"]
    assert table["columns"] == ["keyphrase", "gold", "run 1 rank", f"run 1 model's rank of {len(scored)}", "run 1 score"]
    ranked = sorted((row for row in table["rows"] if row[2]), key=lambda row: int(row[2]))
    # the written phrases: the side file's first five, each with its score and the same rank in both columns
    assert [(row[0], row[3], float(row[4])) for row in ranked] == [
        (" ".join(entry["phrase"]).lower(), str(rank), pytest.approx(entry["score"], rel=1e-3))
        for rank, entry in enumerate(scored[:5], start=1)]
    # a gold phrase the model scored but did not write shows its rank among all it scored
    ranks = {" ".join(entry["phrase"]).lower(): rank for rank, entry in enumerate(scored, start=1)}
    for row in table["rows"]:
        if row[1] == "gold" and not row[2]:
            assert row[3] == str(ranks.get(row[0], ""))
    assert full["run_fields"][0][1] == ["scores", f"from {pred.name}.scores.jsonl: the best n-gram logit of each phrase"]



@pytest.mark.parametrize("task", list(MAKERS))
def test_a_tasks_browser_reads_the_gold_file_once(task, shared_data, tmp_path, monkeypatch):
    # (the pages' views of NQ read it again, one example each, by design: the page texts are not kept)
    import builtins

    from longdoc.tasks import REGISTRY

    gold, preds, options = prediction_files(task, shared_data, tmp_path)
    opened = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    browser = REGISTRY.get(task).load("browse").open_browser(gold, preds, **options)
    assert browser.rows and opened.count(str(gold)) == 1
