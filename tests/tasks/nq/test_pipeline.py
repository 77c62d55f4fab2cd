"""Natural Questions end to end: reader (both formats, streaming, bad lines), features, training,
`longdoc predict nq` scored by `longdoc evaluate nq`. Real data: the two-example sample in
../shared/data; everything else runs on synthetic files (longdoc.tasks.nq.synthetic), made here."""

import gzip
import json
import warnings

import pytest
import torch

from longdoc.cli import main
from longdoc.data.features import GlobalKind, GlobalMarkers, build_features
from longdoc.errors import InputError
from longdoc.tasks import get_task
from longdoc.tasks.nq import NQOptions
from longdoc.tasks.nq.decode import candidate_tokens
from longdoc.tasks.nq.features import (
    NULL, SHORT, HtmlMarkerTokenizer, document_token_index, feature_settings, gold_answer,
    training_features, window_row,
)
from longdoc.tasks.nq.model import NQModel
from longdoc.tasks.nq.reader import read_examples, token_char_spans
from longdoc.tasks.nq.synthetic import write_synthetic_nq
from tests.tasks.conftest import TINY_ENCODER, write_encoder
from tests.conftest import logged_losses

SAMPLE = "natural_questions/simplified-nq-train.sample2.jsonl"


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory, tokenizer):
    return write_encoder(tmp_path_factory.mktemp("nq_encoder"), tokenizer, **TINY_ENCODER, long_max_len=1024,
                         global_max_len=160)


def nq_model(encoder_dir, **options) -> NQModel:
    torch.manual_seed(0)
    return NQModel.from_encoder(encoder_dir, **{"stride": 96, **options})


def windows_of(example, tokenizer, model):
    return build_features(example, HtmlMarkerTokenizer(tokenizer), feature_settings(model.config),
                          GlobalMarkers.from_tokenizer(tokenizer))


def test_real_sample_windows_cover_candidates_and_offsets_map_back(shared_data, tokenizer, encoder_dir):
    model = nq_model(encoder_dir)
    examples = list(read_examples(shared_data / SAMPLE))
    assert [e.labels["example_id"] for e in examples] == [-8062182676792486818, 5328212470870865242]
    checked_tokens = checked_candidates = 0
    for example in examples:
        text = example.documents[0].text
        token_of = document_token_index(text)
        tokens = text.split(" ")
        spans = token_char_spans(text)
        paragraphs = example.documents[0].paragraphs
        for features in windows_of(example, tokenizer, model):
            # Every top-level candidate with a token in this window has its own global token.
            held = {p for p, paragraph in enumerate(paragraphs)
                    for (start, end), source in zip(features.long_offsets, features.long_source_ids)
                    if source == 0 and paragraph.span.start <= start < paragraph.span.end}
            globals_ = {item for kind, item in zip(features.global_kinds, features.global_item_ids)
                        if kind == GlobalKind.PARAGRAPH}
            assert held == globals_ == set(candidate_tokens(example, features))
            checked_candidates += len(held)
            for (start, end), source, token_id in zip(features.long_offsets, features.long_source_ids,
                                                      features.long_input_ids):
                if source != 0:
                    continue
                index = token_of(start)
                # Each wordpiece lies inside one document token; an HTML tag is one marker wordpiece.
                assert spans[index][0] <= start < end <= spans[index][1]
                if tokens[index].startswith("<") and tokens[index].endswith(">") and len(tokens[index]) > 2:
                    assert (start, end) == spans[index] and tokenizer.convert_ids_to_tokens(token_id).startswith("[unused")
                checked_tokens += 1
    assert checked_candidates > 30 and checked_tokens > 20000
    # The gold short answer of example 2 (tokens 213..215) maps to exactly those document tokens.
    example = examples[1]
    gold = gold_answer(example)
    assert example.text_of(gold["short"]) == "Tracy McConnell"
    rows = [window_row(f, gold) for f in windows_of(example, tokenizer, model)]
    short_rows = [(r, f) for r, f in zip(rows, windows_of(example, tokenizer, model)) if r["answer_type"] == SHORT]
    assert short_rows
    for row, features in short_rows:
        first, last = row["short_start_positions"], row["short_end_positions"]
        token_of = document_token_index(example.documents[0].text)
        assert (token_of(features.long_offsets[first][0]), token_of(features.long_offsets[last][1] - 1) + 1) == (213, 215)
        assert (token_of(features.long_offsets[row["long_start_positions"]][0]),
                token_of(features.long_offsets[row["long_end_positions"]][1] - 1) + 1) == (212, 310)


def test_null_windows_are_downsampled(shared_data, tokenizer, encoder_dir):
    model = nq_model(encoder_dir)
    every = training_features(shared_data / SAMPLE, tokenizer, model.config, NQOptions(null_window_keep_rate=1.0),
                              progress=False)
    some = training_features(shared_data / SAMPLE, tokenizer, model.config, NQOptions(null_window_keep_rate=0.2),
                             progress=False)
    answered = [r for r in every if r["answer_type"] != NULL]
    assert answered and [r for r in some if r["answer_type"] != NULL] == answered
    nulls, kept = len(every) - len(answered), len(some) - len(answered)
    print(f"null windows: {nulls} at rate 1.0, {kept} kept at rate 0.2")
    assert 0.1 * nulls < kept < 0.3 * nulls
    # The same draw again: the same windows.
    again = training_features(shared_data / SAMPLE, tokenizer, model.config, NQOptions(null_window_keep_rate=0.2),
                              progress=False)
    assert [r["long_input_ids"] for r in again] == [r["long_input_ids"] for r in some]


def test_original_and_simplified_formats_give_the_same_examples(tmp_path):
    simplified = write_synthetic_nq(tmp_path / "synthetic-simplified.jsonl", 3, original_format=False, seed=5)
    original = write_synthetic_nq(tmp_path / "synthetic-original.jsonl.gz", 3, original_format=True, seed=5)
    for a, b in zip(read_examples(simplified), read_examples(original), strict=True):
        assert a.documents[0].text == b.documents[0].text
        assert [p.span for p in a.documents[0].paragraphs] == [p.span for p in b.documents[0].paragraphs]
        assert a.answers == b.answers and "token_bytes" in b.labels and "token_bytes" not in a.labels
        # Only top-level candidates are paragraphs (the table's cells are nested).
        candidates = a.labels["long_answer_candidates"]
        assert len(a.documents[0].paragraphs) == sum(c["top_level"] for c in candidates) < len(candidates)


def test_bad_lines_name_file_and_line_and_are_skipped_only_when_asked(tmp_path):
    path = write_synthetic_nq(tmp_path / "synthetic.jsonl", 3, seed=1)
    lines = path.read_text().splitlines()
    lines.insert(1, '{"example_id": 5, "question_text": ')
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"synthetic.jsonl:2:.*not valid JSON"):
        list(read_examples(path))
    skipped = []
    with pytest.warns(UserWarning, match=r"skipped 1 bad line"):
        examples = list(read_examples(path, skip_bad_lines=True, skipped=skipped))
    assert len(examples) == 3 and len(skipped) == 1 and ":2:" in skipped[0]


@pytest.mark.slow
def test_training_stops_at_a_bad_line_unless_told_to_skip(tmp_path, encoder_dir, capsys):
    path = write_synthetic_nq(tmp_path / "synthetic.jsonl", 2, seed=1)
    path.write_text(path.read_text() + "{oops\n")
    command = ["train", "nq", "--init", str(encoder_dir), "--train", str(path), "--out", str(tmp_path / "run"),
               "--max-steps", "1", "--batch-size", "1", "--save-steps", "1"]
    assert main(command) == 2
    assert "synthetic.jsonl:3:" in capsys.readouterr().err
    with pytest.warns(UserWarning, match=r"skipped 1 bad line"):
        assert main([*command, "--skip-bad-lines"]) == 0
    # A reading option, not a model one: the trained model does not carry it into prediction.
    assert "skip_bad_lines" not in json.loads((tmp_path / "run" / "config.json").read_text())["task_options"]


def test_spans_outside_the_document_are_refused(tmp_path):
    path = write_synthetic_nq(tmp_path / "synthetic.jsonl", 1, seed=2)
    record = json.loads(path.read_text())
    record["annotations"][0]["short_answers"][0]["end_token"] = 10**6
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(InputError, match=r"example '1000000'.*annotations\[0\]\.short_answers\[0\].*outside"):
        list(read_examples(path))
    record["annotations"][0]["short_answers"] = []
    record["long_answer_candidates"][0]["start_token"] = -3
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(InputError, match=r"long_answer_candidates\[0\].*outside"):
        list(read_examples(path))


@pytest.mark.slow
def test_streaming_with_two_processes_gives_the_same_rows(tmp_path, tokenizer, encoder_dir):
    from longdoc.tasks.nq.features import iter_training_rows

    path = write_synthetic_nq(tmp_path / "synthetic.jsonl.gz", 20, original_format=True, seed=3)
    config = nq_model(encoder_dir).config
    one = [rows for rows in iter_training_rows(path, tokenizer, config, None, num_proc=1, progress=False)]
    two = [rows for rows in iter_training_rows(path, tokenizer, config, None, num_proc=2, progress=False)]
    assert len(one) == 20 and one == two


@pytest.mark.slow
def test_training_lowers_the_loss_and_predictions_score(shared_data, tokenizer, encoder_dir, tmp_path):
    # The training engine (`longdoc train nq`) on the real sample: its 3 kept windows in one batch,
    # so every step's loss is on the same rows (no dropout in the tiny encoder).
    out = tmp_path / "run"
    assert main(["train", "nq", "--init", str(encoder_dir), "--train", str(shared_data / SAMPLE), "--out", str(out),
                 "--max-steps", "12", "--batch-size", "3", "--lr", "3e-3", "--warmup-ratio", "0", "--log-steps", "1",
                 "--stride", "96", "--null-window-keep-rate", "0.1"]) == 0
    losses = logged_losses(out)
    print(f"nq loss on the real sample (longdoc train, 12 steps): {losses[0]:.4f} -> {losses[-1]:.4f}")
    assert len(losses) == 12 and losses[-1] < 0.85 * losses[0]

    pred = tmp_path / "pred.json"
    assert main(["predict", "nq", "--model", str(out), "--data", str(shared_data / SAMPLE),
                 "--out", str(pred), "--batch-size", "16"]) == 0
    predictions = json.loads(pred.read_text())["predictions"]
    examples = {e.labels["example_id"]: e for e in read_examples(shared_data / SAMPLE)}
    assert sorted(p["example_id"] for p in predictions) == sorted(examples)
    for prediction in predictions:
        example = examples[prediction["example_id"]]
        long_span = (prediction["long_answer"]["start_token"], prediction["long_answer"]["end_token"])
        top_level = {(c["start_token"], c["end_token"]) for c in example.labels["long_answer_candidates"]
                     if c["top_level"]}
        assert long_span in top_level
        num_tokens = len(example.documents[0].text.split(" "))
        for short in prediction["short_answers"]:
            assert long_span[0] <= short["start_token"] < short["end_token"] <= min(long_span[1], num_tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no format complaints
        metrics = get_task("nq").load("metric").evaluate_files(shared_data / SAMPLE, pred, long_non_null_threshold=1,
                                                              short_non_null_threshold=1)
    assert 0 <= metrics["long-best-threshold-f1"] <= 1
    assert main(["evaluate", "nq", "--gold", str(shared_data / SAMPLE), "--pred", str(pred),
                 "--long-non-null-threshold", "1", "--short-non-null-threshold", "1", "--json"]) == 0


@pytest.mark.slow
def test_original_format_predictions_carry_byte_offsets(tmp_path, tokenizer, encoder_dir):
    path = write_synthetic_nq(tmp_path / "synthetic-original.jsonl.gz", 3, original_format=True, seed=4,
                              html_padding_bytes=100)
    model = nq_model(encoder_dir)  # untrained: the offsets, not the answers, are checked
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    pred = tmp_path / "pred.json"
    assert main(["predict", "nq", "--model", str(tmp_path / "model"), "--data", str(path), "--out", str(pred)]) == 0
    records = {json.loads(line)["example_id"]: json.loads(line) for line in gzip.open(path, "rt")}
    for prediction in json.loads(pred.read_text())["predictions"]:
        record = records[prediction["example_id"]]
        tokens = record["document_tokens"]
        long_answer = prediction["long_answer"]
        assert long_answer["start_byte"] == tokens[long_answer["start_token"]]["start_byte"]
        assert long_answer["end_byte"] == tokens[long_answer["end_token"] - 1]["end_byte"]
        for short in prediction["short_answers"]:
            assert short["start_byte"] == tokens[short["start_token"]]["start_byte"]
            assert short["end_byte"] == tokens[short["end_token"] - 1]["end_byte"]
    assert main(["evaluate", "nq", "--gold", str(path), "--pred", str(pred), "--long-non-null-threshold", "1",
                 "--short-non-null-threshold", "1", "--json"]) == 0
