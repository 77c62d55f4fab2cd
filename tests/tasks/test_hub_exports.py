"""The Hub's `datasets` exports of HotpotQA, WikiHop and Natural Questions read into the same
examples and features as the official files: each export is built here, in the Hub's schema, from
the official samples in ../shared/data, then written as save_to_disk folder, parquet and JSON lines."""

import json

import datasets
import pytest

from longdoc.errors import InputError
from longdoc.model.config import GlobalLocalConfig
from longdoc.tasks.hotpotqa import features as hotpotqa_features
from longdoc.tasks.hotpotqa.model import HotpotQAModel
from longdoc.tasks.hotpotqa.reader import read_examples as read_hotpotqa
from longdoc.tasks.nq import NQOptions
from longdoc.tasks.nq import features as nq_features
from longdoc.tasks.nq.model import NQModel
from longdoc.tasks.nq.reader import read_examples as read_nq
from longdoc.tasks.wikihop import features as wikihop_features
from longdoc.tasks.wikihop.model import WikiHopModel
from longdoc.tasks.wikihop.reader import read_examples as read_wikihop

HOTPOTQA = "hotpotqa/hotpot_dev_distractor_v1.first53.json"
WIKIHOP = "wikihop/wikihop_dev.first28.json"
NQ = "natural_questions/simplified-nq-train.sample2.jsonl"

HOTPOTQA_FEATURES = datasets.Features({
    "id": datasets.Value("string"), "question": datasets.Value("string"), "answer": datasets.Value("string"),
    "type": datasets.Value("string"), "level": datasets.Value("string"),
    "supporting_facts": datasets.Sequence({"title": datasets.Value("string"), "sent_id": datasets.Value("int32")}),
    "context": datasets.Sequence({"title": datasets.Value("string"),
                                  "sentences": datasets.Sequence(datasets.Value("string"))}),
})
WIKIHOP_FEATURES = datasets.Features({
    "id": datasets.Value("string"), "question": datasets.Value("string"), "answer": datasets.Value("string"),
    "candidates": datasets.Sequence(datasets.Value("string")), "supports": datasets.Sequence(datasets.Value("string")),
    "annotations": datasets.Sequence(datasets.Sequence(datasets.Value("string"))),
})
_SPAN = {"start_token": datasets.Value("int64"), "end_token": datasets.Value("int64"),
         "start_byte": datasets.Value("int64"), "end_byte": datasets.Value("int64")}
NQ_FEATURES = datasets.Features({
    "id": datasets.Value("string"),
    "document": {"title": datasets.Value("string"), "url": datasets.Value("string"), "html": datasets.Value("string"),
                 "tokens": datasets.Sequence({"token": datasets.Value("string"), "is_html": datasets.Value("bool"),
                                              "start_byte": datasets.Value("int64"), "end_byte": datasets.Value("int64")})},
    "question": {"text": datasets.Value("string"), "tokens": datasets.Sequence(datasets.Value("string"))},
    "long_answer_candidates": datasets.Sequence({**_SPAN, "top_level": datasets.Value("bool")}),
    "annotations": datasets.Sequence({
        "id": datasets.Value("string"),
        "long_answer": {**_SPAN, "candidate_index": datasets.Value("int64")},
        "short_answers": datasets.Sequence({**_SPAN, "text": datasets.Value("string")}),
        "yes_no_answer": datasets.ClassLabel(names=["NO", "YES"]),
    }),
})


def _columns(items, names):
    """A sequence of records as `datasets` stores it: one record of lists."""
    return {name: [item[name] for item in items] for name in names}


def _hotpotqa_rows(records):
    return [{"id": r["_id"], "question": r["question"], "answer": r["answer"], "type": r["type"], "level": r["level"],
             "supporting_facts": _columns([{"title": t, "sent_id": s} for t, s in r["supporting_facts"]],
                                          ("title", "sent_id")),
             "context": _columns([{"title": t, "sentences": s} for t, s in r["context"]], ("title", "sentences"))}
            for r in records]


def _wikihop_rows(records):
    return [{"id": r["id"], "question": r["query"], "answer": r["answer"], "candidates": r["candidates"],
             "supports": r["supports"], "annotations": r.get("annotations", [])} for r in records]


def _nq_rows(lines):
    """The Hub's original-format rows of simplified NQ lines: tokens from document_text, with byte
    offsets of the space-joined text (the simplified file has none of its own)."""
    rows = []
    for record in lines:
        tokens, position, spans = record["document_text"].split(" "), 0, []
        for token in tokens:
            spans.append((position, position + len(token.encode())))
            position += len(token.encode()) + 1

        span_names = ("start_token", "end_token", "start_byte", "end_byte")

        def span(item, extra=()):
            start, end = item["start_token"], item["end_token"]
            bytes_ = (spans[start][0], spans[end - 1][1]) if 0 <= start < end else (-1, -1)
            return {"start_token": start, "end_token": end, "start_byte": bytes_[0], "end_byte": bytes_[1],
                    **{name: item[name] for name in extra}}

        rows.append({
            "id": str(record["example_id"]),
            "document": {"title": "", "url": record["document_url"], "html": "",
                         "tokens": _columns([{"token": t, "is_html": t.startswith("<") and t.endswith(">"),
                                              "start_byte": s, "end_byte": e} for t, (s, e) in zip(tokens, spans)],
                                            ("token", "is_html", "start_byte", "end_byte"))},
            "question": {"text": record["question_text"], "tokens": record["question_text"].split()},
            "long_answer_candidates": _columns([span(c, ("top_level",)) for c in record["long_answer_candidates"]],
                                               span_names + ("top_level",)),
            "annotations": _columns([{"id": str(a["annotation_id"]),
                                      "long_answer": span(a["long_answer"], ("candidate_index",)),
                                      "short_answers": _columns(
                                          [{**span(s), "text": " ".join(tokens[s["start_token"]:s["end_token"]])}
                                           for s in a["short_answers"]], span_names + ("text",)),
                                      "yes_no_answer": {"NONE": -1, "NO": 0, "YES": 1}[a["yes_no_answer"]]}
                                     for a in record["annotations"]],
                                    ("id", "long_answer", "short_answers", "yes_no_answer")),
        })
    return rows


def _exports(rows, features, folder):
    """The same rows as a save_to_disk folder, a parquet file and a JSON-lines export."""
    table = datasets.Dataset.from_list(rows, features=features)
    table.save_to_disk(str(folder / "saved"))
    table.to_parquet(str(folder / "rows.parquet"))
    table.to_json(str(folder / "rows.jsonl"))
    return [folder / "saved", folder / "rows.parquet", folder / "rows.jsonl"]


def _config(tokenizer, model_class):
    config = GlobalLocalConfig(vocab_size=tokenizer.vocab_size, hidden_size=8, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=16, long_max_len=512, global_max_len=256)
    config.task_options = dict(model_class.default_task_options)
    return config


def test_hotpotqa_exports_give_the_official_examples_and_features(shared_data, tokenizer, tmp_path):
    official = shared_data / HOTPOTQA
    rows = _hotpotqa_rows(json.loads(official.read_text()))
    expected = list(read_hotpotqa(official))
    expected_features = hotpotqa_features.training_features(official, tokenizer, _config(tokenizer, HotpotQAModel), progress=False)
    for export in _exports(rows, HOTPOTQA_FEATURES, tmp_path):
        assert list(read_hotpotqa(export)) == expected, export
    export = tmp_path / "saved"
    assert hotpotqa_features.training_features(export, tokenizer, _config(tokenizer, HotpotQAModel), progress=False) == expected_features


@pytest.mark.filterwarnings("ignore:.*longer than long_max_len")
def test_wikihop_exports_give_the_official_examples_and_features(shared_data, tokenizer, tmp_path):
    official = shared_data / WIKIHOP
    rows = _wikihop_rows(json.loads(official.read_text()))
    expected = list(read_wikihop(official))
    for export in _exports(rows, WIKIHOP_FEATURES, tmp_path):
        assert list(read_wikihop(export)) == expected, export
    config = _config(tokenizer, WikiHopModel)
    assert (wikihop_features.training_features(tmp_path / "rows.parquet", tokenizer, config, progress=False)
            == wikihop_features.training_features(official, tokenizer, config, progress=False))


def test_nq_exports_give_the_official_examples_and_features(shared_data, tokenizer, tmp_path):
    official = shared_data / NQ
    lines = [json.loads(line) for line in official.read_text().splitlines() if line.strip()]
    expected = list(read_nq(official))
    for export in _exports(_nq_rows(lines), NQ_FEATURES, tmp_path):
        examples = list(read_nq(export))
        # The Hub's rows are the original format, whose byte offsets the simplified file lacks.
        for example in examples:
            assert len(example.labels.pop("token_bytes")) == len(example.documents[0].text.split(" "))
        assert [e.documents for e in examples] == [e.documents for e in expected], export
        assert [(e.id, e.question, e.answers) for e in examples] == [(e.id, e.question, e.answers) for e in expected]
        assert [e.labels["example_id"] for e in examples] == [line["example_id"] for line in lines]
    config = _config(tokenizer, NQModel)
    options = NQOptions(null_window_keep_rate=1.0)
    assert (nq_features.training_features(tmp_path / "saved", tokenizer, config, options, progress=False)
            == nq_features.training_features(official, tokenizer, config, options, progress=False))


def test_an_export_of_another_dataset_is_refused_naming_its_columns(shared_data, tmp_path):
    rows = _wikihop_rows(json.loads((shared_data / WIKIHOP).read_text()))
    [folder, *_] = _exports(rows, WIKIHOP_FEATURES, tmp_path)
    with pytest.raises(InputError, match=r"not a HotpotQA export: it has the columns .*'candidates'.*missing \['supporting_facts', 'context'\]"):
        list(read_hotpotqa(folder))


def test_a_folder_that_is_no_export_names_the_formats_read(tmp_path):
    (tmp_path / "notes").mkdir()
    with pytest.raises(InputError, match="not one written by datasets' save_to_disk.*parquet"):
        list(read_wikihop(tmp_path / "notes"))


def test_a_file_in_neither_format_names_the_formats_read(tmp_path):
    (tmp_path / "questions.csv").write_text("id,question\n1,why?\n")
    with pytest.raises(InputError, match=r"questions.csv:1:1: not valid JSON.*; read are the official file, a folder "
                                         r"written by datasets' save_to_disk, a parquet file, or a JSON-lines export"):
        list(read_hotpotqa(tmp_path / "questions.csv"))


def test_a_dataset_dict_folder_asks_for_one_split(shared_data, tmp_path):
    rows = _hotpotqa_rows(json.loads((shared_data / HOTPOTQA).read_text())[:2])
    datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows, features=HOTPOTQA_FEATURES)}).save_to_disk(
        str(tmp_path / "hotpot"))
    with pytest.raises(InputError, match=r"a DatasetDict with the splits \['validation'\]: give one split's folder"):
        list(read_hotpotqa(tmp_path / "hotpot"))
