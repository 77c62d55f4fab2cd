"""`longdoc ask` with a lifted extractive QA reader (span mode) and without a reader (sentence mode).

Span mode is held against the standard sliding-window reader (benchmarks.readers) with the same
checkpoint: on short documents both read the same pair, so their best answers are the same; the
reading rules (null score, answer length) are pinned with hand-made logits."""

import json
import types
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from benchmarks.readers import SlidingWindowReader, make_fact_questions
from longdoc.ask.span_reading import read_spans
from longdoc.cli import main
from longdoc.convert.pretrained import minilm_path


@pytest.mark.slow  # every document read by both readers
def test_top_answer_on_short_documents_equals_the_sliding_window_readers(lifted_reader, tmp_path, capsys):
    peer = SlidingWindowReader(lifted_reader / "source")
    documents = make_fact_questions(6, seed=3, words=60, distractors=2)
    for number, document in enumerate(documents):
        path = tmp_path / f"document{number}.txt"
        path.write_text(document.context, encoding="utf-8")
        capsys.readouterr()
        assert main(["ask", "--model", str(lifted_reader / "lifted"), "--question", document.question,
                     "--min-evidence", "-1", "--json", str(path)]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["mode"] == "span"
        [answer] = result["answers"]
        expected = peer.answer(document.question, document.context)
        assert (answer["text"], answer["start"], answer["end"]) == (expected.text, expected.start, expected.end)
        assert document.context[answer["start"]:answer["end"]] == answer["text"] != ""
        support = answer["support"]  # the sentences the answer lies in, exact too
        assert support[0]["start"] <= answer["start"] and answer["end"] <= support[-1]["end"]
        assert all(document.context[s["start"]:s["end"]] == s["text"] for s in support)


def test_a_question_longer_than_the_readers_share_of_a_row_is_cut_with_a_warning(lifted_reader, tmp_path, capsys):
    # 325 wordpieces (1,574 characters, under ask's 2,000): the tokenizer, asked to cut the passage
    # alone, could not make a row of it (a panic from the tokenizers library, exit 1).
    [document] = make_fact_questions(1, seed=3, words=60, distractors=2)
    path = tmp_path / "document.txt"
    path.write_text(document.context, encoding="utf-8")
    question = " ".join(["What is the name of the fight song of the university in Kansas"] * 25)
    with pytest.warns(UserWarning, match=r"the question is 325 wordpieces long and the reader reads its first 64 "
                                         r"\(307 of its 1574 characters"):
        assert main(["ask", "--model", str(lifted_reader / "lifted"), "--question", question, "--min-evidence",
                     "-1", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["mode"] == "span"


def test_long_documents_are_read_in_retrieved_passages_with_exact_offsets(lifted_reader, tmp_path, capsys):
    document = make_fact_questions(1, seed=4, words=1500, distractors=10)[0]
    path = tmp_path / "long.txt"
    path.write_text(document.context, encoding="utf-8")
    assert main(["ask", "--model", str(lifted_reader / "lifted"), "--question", document.question, "--top-k", "3",
                 "--passages", "2", "--min-evidence", "-1", "--json", str(path)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["passages"]) == 2 and 1 <= len(result["answers"]) <= 3
    read = [(passage["start"], passage["end"]) for passage in result["passages"]]
    for answer in result["answers"]:
        assert document.context[answer["start"]:answer["end"]] == answer["text"]
        assert any(start <= answer["start"] and answer["end"] <= end for start, end in read)
    assert [a["score"] for a in result["answers"]] != [] and all(0 <= a["score"] <= 1 for a in result["answers"])

    # --min-score holds for a QA reader as for a task model: answers under it dropped, none left: no answer
    scores = sorted(answer["score"] for answer in result["answers"])
    floor = (scores[0] + scores[-1]) / 2 if scores[0] < scores[-1] else scores[-1]
    command = ["ask", "--model", str(lifted_reader / "lifted"), "--question", document.question, "--top-k", "3",
               "--passages", "2", "--min-evidence", "-1", "--json", str(path)]
    assert main([*command, "--min-score", str(floor)]) == 0
    kept = json.loads(capsys.readouterr().out)["answers"]
    assert kept and [a["score"] for a in kept] == [a["score"] for a in result["answers"] if a["score"] >= floor]
    assert main([*command, "--min-score", str(scores[-1] + 1e-6)]) == 0
    assert json.loads(capsys.readouterr().out)["answers"] == []


def test_without_a_model_the_answers_are_the_nearest_sentences(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("Orbix Group sells lamps.\n\nMara Quell was born in Tallinnford. She paints bridges.\n",
                    encoding="utf-8")
    assert main(["ask", "--question", "Where was Mara Quell born?", "--top-k", "2", "--json", str(path)]) == 0
    captured = capsys.readouterr()
    assert "answering with sentences" in captured.err and "longdoc lift --from QA_CHECKPOINT" in captured.err
    result = json.loads(captured.out)
    assert result["mode"] == "sentence"
    assert [answer["text"] for answer in result["answers"]][0] == "Mara Quell was born in Tallinnford."
    for answer in result["answers"]:
        assert path.read_text()[answer["start"]:answer["end"]] == answer["text"]
    assert result["answers"][0]["score"] == result["evidence"] >= result["answers"][1]["score"]


class HandMadeReader:
    """A stand-in for a SpanReader: the logits it gives every row are set by the test."""

    def __init__(self, start, end):
        self.config = types.SimpleNamespace(local_radius=383)
        self.device = torch.device("cpu")
        self.start, self.end = start, end

    def __call__(self, long_input_ids, **_):
        rows, length = long_input_ids.shape
        return types.SimpleNamespace(start_logits=self.start(length).expand(rows, length),
                                     end_logits=self.end(length).expand(rows, length))


def _logits(length, values):
    logits = torch.full((length,), -10.0)
    for position, value in values.items():
        logits[position] = value
    return logits


def test_the_null_score_refuses_only_when_asked_and_only_when_it_beats_every_span():
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    question, context = "Where?", "Mara was born in Tallinnford today."
    # [CLS] where ? [SEP] mara(4) was born in tallinn(8) ##ford(9) today(10) . [SEP]
    span = {8: 4.0}, {9: 4.0}
    for null, refused in ((9.0, True), (7.0, False)):
        reader = HandMadeReader(lambda n: _logits(n, {0: null / 2, **span[0]}),
                                lambda n: _logits(n, {0: null / 2, **span[1]}))
        kept = read_spans(question, [context], reader, tokenizer, max_answer_len=15)
        assert kept[0].logit == 8.0 and context[kept[0].start:kept[0].end] == "Tallinnford"
        handled = read_spans(question, [context], reader, tokenizer, max_answer_len=15, handle_impossible=True)
        assert (handled == []) is refused


def test_answers_are_at_most_max_answer_len_wordpieces_and_inside_the_context():
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    question, context = "Where?", "Mara was born in Tallinnford today."
    # The best start is in the question (position 1): never an answer; the best end is 5 tokens after 4.
    reader = HandMadeReader(lambda n: _logits(n, {1: 9.0, 4: 5.0, 8: 1.0}), lambda n: _logits(n, {9: 5.0, 5: 0.0}))
    [best, *_] = read_spans(question, [context], reader, tokenizer, max_answer_len=15)
    assert context[best.start:best.end] == "Mara was born in Tallinnford"
    [best, *_] = read_spans(question, [context], reader, tokenizer, max_answer_len=2)
    assert context[best.start:best.end] == "Tallinnford"  # 1 + 5 beats "Mara was" (5 + 0)


def test_read_all_gives_the_sliding_window_readers_answer_on_a_real_document(lifted_reader, tmp_path, capsys):
    # The ten paragraphs of the first HotpotQA dev-sample question: real text over several 384-wordpiece windows.
    record = json.loads((Path(__file__).parents[2] / "../shared/data/hotpotqa/hotpot_dev_distractor_v1.first53.json")
                        .read_text(encoding="utf-8"))[0]
    text = "\n\n".join(title + "\n" + "".join(sentences) for title, sentences in record["context"])
    path = tmp_path / "paragraphs.txt"
    path.write_text(text, encoding="utf-8")
    peer = SlidingWindowReader(lifted_reader / "source")
    assert len(peer.tokenizer(record["question"], text)["input_ids"]) > 2 * 384
    expected = peer.answer(record["question"], text)
    options = ["ask", "--model", str(lifted_reader / "lifted"), "--question", record["question"], "--passages", "2",
               "--min-evidence", "-1", "--json", str(path)]
    assert main(options) == 0
    assert json.loads(capsys.readouterr().out)["read"] == "retrieved"
    assert main([*options, "--read-all"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["read"] == "all" and result["answers"][0]["found_by"] == []
    answer = result["answers"][0]
    assert (answer["text"], answer["start"], answer["end"]) == (expected.text, expected.start, expected.end)
    assert text[answer["start"]:answer["end"]] == answer["text"] != ""


def test_out_of_device_memory_names_what_ask_can_lower(lifted_reader, tmp_path, capsys, monkeypatch):
    # ask has no --batch-size: out of memory while reading, it names its own options in one line, exit 2
    from longdoc.model.modeling import EncoderForward  # the encoder's forward, in every model class

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(EncoderForward, "forward", out_of_memory)
    document = make_fact_questions(1, seed=4, words=200, distractors=2)[0]
    path = tmp_path / "notes.txt"
    path.write_text(document.context, encoding="utf-8")
    assert main(["ask", "--model", str(lifted_reader / "lifted"), "--question", document.question,
                 "--min-evidence", "-1", "--quiet", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == ("longdoc ask: error: out of device memory reading the passages: compute "
                                            "in bfloat16 (--bf16), or read fewer passages (--passages)")
    assert "Traceback" not in err
