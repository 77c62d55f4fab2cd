"""Readers on the real samples of all four datasets: offsets exact for every long token (WordPiece
and byte-level BPE), gold answers and candidate mentions round-trip through token spans, and bad
records fail naming the example id and the field."""

import json
import re
from functools import lru_cache

import pytest

from longdoc.errors import InputError
from longdoc.data.features import FeatureSettings, build_features
from longdoc.convert.pretrained import default_tokenizer
from longdoc.data.spans import char_span_to_token_span, token_span_to_char_span
from longdoc.tasks.hotpotqa.reader import read_examples as read_hotpotqa
from longdoc.tasks.nq.reader import read_examples as read_nq
from longdoc.tasks.openkp.reader import read_examples as read_openkp
from longdoc.tasks.wikihop.reader import read_examples as read_wikihop
from tests.data.token_text import check_offsets, small_bpe_tokenizer

FILES = {
    "hotpotqa": (read_hotpotqa, ["hotpotqa/hotpot_dev_distractor_v1.first53.json"]),
    "wikihop": (read_wikihop, ["wikihop/wikihop_dev.first28.json", "wikihop/wikihop_train.first22.json"]),
    "nq": (read_nq, ["natural_questions/simplified-nq-train.sample2.jsonl"]),
    "openkp": (read_openkp, ["openkp/openkp_readme_example.jsonl"]),
}
SETTINGS = FeatureSettings(long_max_len=512, global_max_len=256, stride=128, global_feature_size=0)


def examples(shared_data, task):
    reader, paths = FILES[task]
    return [example for path in paths for example in reader(shared_data / path)]


@lru_cache(maxsize=None)
def tokenizers(root):
    texts = [d.text for task in FILES for e in examples(root, task) for d in e.documents]
    return {"wordpiece": default_tokenizer(), "bpe": small_bpe_tokenizer(texts)}


# Building features of every sample with the small BPE tokenizer takes seconds: the full suite only.
KINDS = ["wordpiece", pytest.param("bpe", marks=pytest.mark.slow)]


def settings_for(task):
    return FeatureSettings(512, 256, stride=128, global_feature_size=20 if task == "openkp" else 0)


@lru_cache(maxsize=None)
def featurized(root, task, kind):
    """(example, its windows) for every example of a task, built once per tokenizer."""
    tokenizer = tokenizers(root)[kind]
    return [(e, build_features(e, tokenizer, settings_for(task))) for e in examples(root, task)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("task", list(FILES))
def test_every_long_token_slices_back_to_its_text(shared_data, task, kind):
    tokenizer = tokenizers(shared_data)[kind]
    checked = sum(check_offsets(w, e, tokenizer) for e, windows in featurized(shared_data, task, kind) for w in windows)
    assert checked > 900  # the smallest sample, OpenKP, has 787 words


def round_trip_failures(example, spans, windows):
    """Gold spans that no window maps to tokens and back to exactly the same characters."""
    failures = []
    for span in spans:
        mapped = [
            token_span_to_char_span(w.long_offsets, w.long_source_ids, tokens)
            for w in windows
            if (tokens := char_span_to_token_span(w.long_offsets, w.long_source_ids, span)) is not None
        ]
        if not mapped or any(back != span for back in mapped):
            failures.append(example.text_of(span))
    return failures


@pytest.mark.parametrize("kind", KINDS)
def test_hotpotqa_answers_round_trip(shared_data, kind, capsys):
    sample = examples(shared_data, "hotpotqa")
    yes_no = [e.id for e in sample if e.labels["answer"] in ("yes", "no")]
    absent = [e.labels["answer"] for e in sample if e.labels["answer"] not in ("yes", "no") and not e.answers]
    spans = failures = 0
    for example, windows in featurized(shared_data, "hotpotqa", kind):
        spans += len(example.answers)
        for text in round_trip_failures(example, example.answers, windows):
            failures += 1
            assert text == example.labels["answer"]  # reader spans hold the exact gold text
    with capsys.disabled():
        print(f"\nHotpotQA ({kind}): {spans} answer spans, {failures} fail the round trip; "
              f"{len(yes_no)} yes/no answers; {len(absent)} answers absent from the sentences: {absent}")
    # README: 9 of the 53 answers are yes/no; every other answer occurs in a sentence here.
    assert len(yes_no) == 9 and absent == [] and failures == 0 and spans >= 44


@pytest.mark.parametrize("kind", KINDS)
def test_wikihop_mentions_round_trip(shared_data, kind, capsys):
    mentions = failures = unmentioned = 0
    for example, windows in featurized(shared_data, "wikihop", kind):
        spans = [m for c in example.candidates for m in c.mentions]
        unmentioned += sum(not c.mentions for c in example.candidates)
        mentions += len(spans)
        for candidate in example.candidates:
            assert all(example.text_of(m).lower() == candidate.text.lower() for m in candidate.mentions)
        failures += len(round_trip_failures(example, spans, windows))
    with capsys.disabled():
        print(f"\nWikiHop ({kind}): {mentions} candidate mentions, {failures} fail the round trip; "
              f"{unmentioned} candidates never mentioned in their supports")
    assert mentions > 3000 and failures == 0


def test_nq_short_answer_round_trips(shared_data):
    nq = featurized(shared_data, "nq", "wordpiece")
    # The second sample's one short answer is "Tracy McConnell" (README: it has a short answer).
    assert [[e.text_of(a) for a in e.answers] for e, _ in nq] == [[], ["Tracy McConnell"]]
    example, windows = nq[1]
    assert round_trip_failures(example, example.answers, windows) == []


def test_openkp_dom_nodes_carry_their_features(shared_data):
    ((example, windows),) = featurized(shared_data, "openkp", "wordpiece")
    # README: 787 tokens and 69 VDOM elements; the first node renders "April 30 2018".
    assert len(example.dom_nodes) == 69 and example.text_of(example.dom_nodes[0].span) == "April 30 2018"
    first = windows[0]
    node_global = first.global_kinds.index(5)  # GlobalKind.DOM_NODE
    assert first.global_features[node_global] == example.dom_nodes[0].features
    assert first.global_features[0] == [0.0] * 20  # CLS carries no visual features


# --- bad input -------------------------------------------------------------------------------

def write_json(path, value):
    path.write_text(json.dumps(value))
    return path


def hotpot_record(**changes):
    record = {"_id": "h1", "question": "Who?", "answer": "Ann", "supporting_facts": [["T", 0]],
              "context": [["T", ["Ann wrote it.", " Then left."]]], "type": "bridge", "level": "hard"}
    record.update(changes)
    return record


@pytest.mark.parametrize(
    "reader,record,field",
    [
        (read_hotpotqa, {k: v for k, v in hotpot_record().items() if k != "question"}, "question"),
        (read_hotpotqa, hotpot_record(context="T"), "context"),
        (read_hotpotqa, hotpot_record(context=[["T", ["ok", 3]]]), "context[0][1]"),
        (read_wikihop, {"id": "w1", "query": "q", "answer": "a", "candidates": ["a", 2], "supports": ["a"]}, "candidates"),
        (read_wikihop, {"id": "w1", "query": "q", "answer": "b", "candidates": ["a"], "supports": ["a"]}, "answer"),
    ],
)
def test_json_readers_name_example_and_field(tmp_path, reader, record, field):
    path = write_json(tmp_path / "data.json", [record])
    with pytest.raises(InputError, match=rf"example '(h1|w1)': field '{re.escape(field)}'"):
        list(reader(path))


@pytest.mark.parametrize(
    "reader,record,field",
    [
        (read_nq, {"example_id": 7, "question_text": "q", "document_text": "a b",
                   "long_answer_candidates": [{"start_token": 0, "end_token": 9, "top_level": True}]},
         "long_answer_candidates[0]"),
        (read_nq, {"example_id": 7, "question_text": 5, "document_text": "a b", "long_answer_candidates": []},
         "question_text"),
        (read_openkp, {"url": "u", "text": "a b", "VDOM": json.dumps([{"start_idx": 0, "end_idx": 1, "feature": [1.0]}])},
         "VDOM[0].feature"),
    ],
)
def test_jsonl_readers_name_line_example_and_field(tmp_path, reader, record, field):
    path = tmp_path / "data.jsonl"
    path.write_text("\n" + json.dumps(record) + "\n")
    with pytest.raises(InputError, match=rf":2: example '(7|u)': field '{re.escape(field)}'"):
        list(reader(path))


def test_invalid_utf8_is_replaced_with_a_warning_and_offsets_stay_exact(tmp_path):
    record = json.dumps([hotpot_record(context=[["T", ["Ann wrote it@@.", " Then left."]]])]).encode()
    path = tmp_path / "bad.json"
    path.write_bytes(record.replace(b"@@", b"\xff\xfe"))  # two invalid bytes inside a sentence
    with pytest.warns(UserWarning, match="not valid UTF-8; 2 invalid byte sequence"):
        (example,) = read_hotpotqa(path)
    assert example.documents[0].text == "T\nAnn wrote it\ufffd\ufffd. Then left."
    tokenizer = default_tokenizer()
    (features,) = build_features(example, tokenizer, SETTINGS)
    assert check_offsets(features, example, tokenizer) > 5
    assert [example.text_of(a) for a in example.answers] == ["Ann"]
    assert round_trip_failures(example, example.answers, [features]) == []
