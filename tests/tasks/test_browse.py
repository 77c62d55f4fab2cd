"""Each task's browse module (what `longdoc serve --task` shows) on the real samples: its per-example
figures are the official metric's (their mean, or for NQ their threshold sweep, is `evaluate_files`),
and its marks sit on the gold file's own text."""

import json
import warnings

import pytest

from longdoc.tasks import get_task
from tests.tasks.predictions import MAKERS, prediction_files


def _opened(task, shared_data, tmp_path):
    gold, preds, options = prediction_files(task, shared_data, tmp_path)
    browser = get_task(task).load("browse").open_browser(gold, preds, **options)
    metric = get_task(task).load("metric")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the perturbed files' missing predictions
        totals = [metric.evaluate_files(gold, pred, allow_missing=True, **options) for pred in preds]
    return gold, browser, totals


@pytest.mark.parametrize("task", ["hotpotqa", "wikihop", "openkp"])
def test_per_example_figures_average_to_the_official_totals(task, shared_data, tmp_path):
    _, browser, totals = _opened(task, shared_data, tmp_path)
    assert browser.totals_are_means
    for run, run_totals in enumerate(totals):
        for key in browser.metric_keys:
            mean = sum(row.runs[run].metrics[key] for row in browser.rows) / len(browser.rows)
            assert mean == pytest.approx(run_totals[key], abs=1e-12), (run, key)
    # The perturbed run is wrong somewhere, the perfect one nowhere.
    assert any(row.runs[0].right is not True for row in browser.rows)
    assert all(row.runs[1].right is True for row in browser.rows)


def test_nq_judgements_sweep_to_the_official_totals(shared_data, tmp_path):
    from longdoc.tasks.nq.metric import AnswerStat, official_metrics, sweep_thresholds

    _, browser, totals = _opened("nq", shared_data, tmp_path)
    for run, run_totals in enumerate(totals):
        figures = [row.runs[run].metrics for row in browser.rows]
        rebuilt = {}
        for kind in ("long", "short"):
            stats = [AnswerStat(bool(f[f"{kind}_gold"]), bool(f[f"{kind}_pred"]), bool(f[f"{kind}_correct"]),
                                f[f"{kind}_score"]) for f in figures]
            rebuilt.update(official_metrics(sweep_thresholds(stats), f"{kind}-"))
        assert rebuilt == {key: value for key, value in run_totals.items() if key in rebuilt}
    assert [row.runs[1].right for row in browser.rows] == [True, True]


def test_hotpotqa_marks_are_the_gold_files_sentences_and_answers(shared_data, tmp_path):
    gold, browser, _ = _opened("hotpotqa", shared_data, tmp_path)
    for record in json.loads(gold.read_text(encoding="utf-8")):
        view = browser.view(record["_id"])
        assert [block.title for block in view.texts] == [title for title, _ in record["context"]]
        for block, (title, sentences) in zip(view.texts, record["context"]):
            assert block.text == "".join(sentences)
            starts = [sum(map(len, sentences[:i])) for i in range(len(sentences))]
            gold_support = {(m.start, m.end) for m in block.marks if m.run is None and m.kind == "support"}
            expected = {(starts[i], starts[i] + len(sentences[i])) for t, i in record["supporting_facts"]
                        if t == title and i < len(sentences)}
            assert gold_support == expected
            # The perfect run marks the same sentences; every answer mark reads the answer.
            assert {(m.start, m.end) for m in block.marks if m.run == 1 and m.kind == "support"} == expected
            for mark in block.marks:
                if mark.kind == "answer":
                    assert block.text[mark.start:mark.end] == record["answer"] or mark.run == 0
    with pytest.raises(KeyError):
        browser.view("no-such-id")


def test_hotpotqa_lists_facts_that_name_no_sentence(shared_data, tmp_path):
    gold, browser, _ = _opened("hotpotqa", shared_data, tmp_path)
    fourth = json.loads(gold.read_text(encoding="utf-8"))[3]["_id"]  # the maker adds a fact outside its context
    fields = dict(browser.view(fourth).run_fields[0])
    assert "'No such paragraph'" in fields["facts not in the context"]


def test_wikihop_marks_the_mentions_of_the_answer_and_the_choice(shared_data, tmp_path):
    gold, browser, _ = _opened("wikihop", shared_data, tmp_path)
    preds = json.loads((tmp_path / "wikihop-perturbed.json").read_text(encoding="utf-8"))
    for record in json.loads(gold.read_text(encoding="utf-8")):
        view = browser.view(record["id"])
        for block, support in zip(view.texts, record["supports"]):
            assert block.text == support
            for mark in block.marks:
                text = block.text[mark.start:mark.end].lower()
                if mark.kind == "answer":
                    assert text == (record["answer"] if mark.run in (None, 1) else preds[record["id"]])
        [table] = view.tables
        assert [row[0] for row in table.rows] == record["candidates"]
        assert [row[1] for row in table.rows].count("gold") == 1


def test_nq_marks_read_the_annotated_tokens(shared_data, tmp_path):
    from longdoc.tasks.nq.gold import iter_gold

    gold, browser, _ = _opened("nq", shared_data, tmp_path)
    for example in iter_gold(gold):
        view = browser.view(str(example.example_id))
        [page] = view.texts
        annotation = example.annotations[0]
        expected = {"long answer": [annotation.long_span], "short answer": list(annotation.short_spans)}
        for kind, spans in expected.items():
            marked = [" ".join(page.text[m.start:m.end].split()) for m in page.marks if m.run is None and m.kind == kind]
            assert marked == [example.document.text(span) for span in spans if not span.is_null]
        assert "<" not in page.text.split(" ")[0]  # HTML tag tokens are not shown


def test_openkp_marks_each_phrase_where_its_tokens_occur(shared_data, tmp_path):
    gold, browser, _ = _opened("openkp", shared_data, tmp_path)
    [row] = browser.rows
    view = browser.view(row.id)
    [page] = view.texts
    phrases = {" ".join(token.lower() for token in phrase) for phrase in
               json.loads(gold.read_text(encoding="utf-8").splitlines()[0])["KeyPhrases"] if phrase}
    gold_marks = [page.text[m.start:m.end].lower() for m in page.marks if m.run is None]
    assert gold_marks and set(gold_marks) == phrases
    ranks = {row_[0]: row_[2] for row_ in view.tables[0].rows}
    assert ranks["java"] == "2"  # the perturbed file's second phrase


def test_every_task_with_a_metric_has_a_browser():
    for task in MAKERS:
        assert get_task(task).browse == f"longdoc.tasks.{task}.browse"
    assert get_task("multihop").browse == get_task("hotpotqa").browse


HOTPOTQA_SCORES = {"id": "q", "answer_type": {"span": 0.5, "yes": 0.25, "no": 0.25}, "sp_threshold": 0.5,
                   "sentences": [["Alpha", 0, 0.75], ["Alpha", 1, 0.0]]}


@pytest.mark.parametrize("task, good, bad, message", [
    ("wikihop", {"id": "q", "candidates": [{"text": "a", "probability": 0.5}, {"text": "b", "probability": None}]},
     {"id": "q", "candidates": [{"text": "a", "probability": True}]}, "'candidates' must be a list of"),
    ("openkp", {"id": "u", "keyphrases": [{"phrase": ["Web", "app"], "score": -3.5}]},
     {"id": "u", "keyphrases": [{"phrase": "web app", "score": 1.0}]}, "'keyphrases' must be a list of"),
    ("hotpotqa", HOTPOTQA_SCORES, {**HOTPOTQA_SCORES, "sentences": [["Alpha", 0, 1.5]]}, "'sentences' must be a list of"),
    ("hotpotqa", HOTPOTQA_SCORES, {**HOTPOTQA_SCORES, "answer_type": {"span": 1.0}}, "'answer_type' must be"),
    ("hotpotqa", HOTPOTQA_SCORES, {**HOTPOTQA_SCORES, "sp_threshold": None}, "'sp_threshold' must be"),
])
def test_each_scores_check_takes_what_its_decoder_writes_and_names_the_field_at_fault(task, good, bad, message):
    check = get_task(task).load("browse").check_scores
    assert check(good) is None
    assert check(bad).startswith(message)
