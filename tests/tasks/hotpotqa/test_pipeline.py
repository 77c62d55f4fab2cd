"""HotpotQA pipeline: labels, decoders on hand-made logits, and a short real run (train, predict, evaluate)."""

import json
import math
import re
import string
import warnings
from collections import Counter

import pytest
import torch

from longdoc.cli import main
from longdoc.data.examples import Document, Paragraph, Span, StructuredExample
from longdoc.data.features import FeatureSettings, GlobalKind, build_features
from longdoc.data.prediction_scores import scores_path
from longdoc.errors import InputError
from longdoc.model.config import GlobalLocalConfig
from longdoc.tasks import get_task
from longdoc.tasks.hotpotqa.decode import (
    SP_THRESHOLD_GRID, WindowScores, choose_sp_threshold, decode_answer, select_facts, sentence_probabilities,
)
from longdoc.tasks.hotpotqa.features import sentence_facts, training_features, window_row
from longdoc.tasks.hotpotqa.model import HotpotQAModel
from longdoc.tasks.hotpotqa.reader import answer_spans
from tests.tasks.conftest import write_encoder
from tests.conftest import logged_losses
from tests.tasks.predictions import model_predictions

SAMPLE = "hotpotqa/hotpot_dev_distractor_v1.first53.json"
WIKIHOP_SAMPLE = "wikihop/wikihop_train.first22.json"


def _paragraph_document(title: str, sentences: list[str]) -> Document:
    text, spans = title + "\n", []
    for sentence in sentences:
        spans.append(Span(len(text), len(text) + len(sentence)))
        text += sentence
    return Document(text, [Paragraph(Span(0, len(text)), spans, title=Span(0, len(title)))])


def _example(answer="Paris", facts=(("Alpha", 1), ("Gamma", 0))) -> StructuredExample:
    example = StructuredExample(
        id="q1", question="Where is the capital of Beta?",
        documents=[_paragraph_document("Alpha", ["Alpha is a town.", " It lies in Beta."]),
                   _paragraph_document("Gamma", ["Gamma is Paris river.", " Beta has a capital."])],
        labels={"answer": answer, "supporting_facts": [list(f) for f in facts]},
    )
    if answer not in ("yes", "no"):
        example.answers = answer_spans(example, answer, set(facts))
    return example.validate()


def _window(example, tokenizer):
    settings = FeatureSettings(long_max_len=128, global_max_len=32, max_question_len=16)
    [features] = build_features(example, tokenizer, settings)
    return features


def _token(features, text, example, occurrence=0):
    """Index of the long token whose text is `text` (the occurrence-th one in the documents)."""
    found = [i for i, ((start, end), source) in enumerate(zip(features.long_offsets, features.long_source_ids))
             if source >= 0 and example.documents[source].text[start:end] == text]
    return found[occurrence]


def _scores(features, type_logits=(5.0, 0.0, 0.0), start=None, end=None, sp=None):
    length, globals_ = len(features.long_input_ids), len(features.global_input_ids)
    start_logits, end_logits, sp_logits = torch.zeros(length), torch.zeros(length), torch.zeros(globals_)
    for position, value in (start or {}).items():
        start_logits[position] = value
    for position, value in (end or {}).items():
        end_logits[position] = value
    for position, value in (sp or {}).items():
        sp_logits[position] = value
    return WindowScores(features, {"type_logits": torch.tensor(type_logits), "start_logits": start_logits,
                                   "end_logits": end_logits, "sp_logits": sp_logits})


def test_labels_of_one_window(tokenizer):
    example = _example()
    features = _window(example, tokenizer)
    row = window_row(example, features, sentence_facts(example))
    paris = _token(features, "Paris", example)
    assert (row["start_positions"], row["end_positions"]) == (paris, paris)
    assert row["answer_type"] == 0
    sentence_globals = [g for g, kind in enumerate(features.global_kinds) if kind == GlobalKind.SENTENCE]
    assert [row["sp_labels"][g] for g in sentence_globals] == [0, 1, 1, 0]
    assert all(row["sp_labels"][g] == -1 for g in range(len(features.global_kinds)) if g not in sentence_globals)
    # Spans may use sentence tokens only: never the question, titles, [CLS]/[SEP].
    assert row["answer_mask"][0] == 0 and row["answer_mask"][1] == 0
    assert row["answer_mask"][_token(features, "Alpha", example, 0)] == 0  # the title
    assert row["answer_mask"][_token(features, "Alpha", example, 1)] == 1  # "Alpha is a town."
    # The answer-type head averages the question's global tokens: exactly those, not CLS.
    assert [g for g, flag in enumerate(row["question_mask"]) if flag] == [
        g for g, kind in enumerate(features.global_kinds) if kind == GlobalKind.QUESTION] != []
    assert row["question_mask"][0] == 0
    yes = window_row(_example("yes"), features, sentence_facts(example))
    assert (yes["answer_type"], yes["start_positions"]) == (1, -1)


def test_span_never_crosses_paragraphs_nor_enters_the_question(tokenizer):
    example = _example()
    features = _window(example, tokenizer)
    question_beta = next(i for i, ((start, end), source) in enumerate(zip(features.long_offsets,
                                                                           features.long_source_ids))
                         if source == -1 and example.question[start:end] == "Beta")
    beta_alpha = _token(features, "Beta", example, 0)  # end of paragraph Alpha
    gamma = _token(features, "Gamma", example, 1)  # start of paragraph Gamma's first sentence
    river = _token(features, "river", example)
    scores = _scores(features,
                     start={question_beta: 50.0, beta_alpha: 20.0, gamma: 4.0},
                     end={question_beta: 50.0, river: 20.0})
    # question..question (100) and Beta (paragraph Alpha)..river (paragraph Gamma) (40) are not allowed.
    assert decode_answer(example, [scores], max_answer_length=30) == "Gamma is Paris river"
    # Bounded length: with at most 2 wordpieces the best is a single token.
    assert decode_answer(example, [scores], max_answer_length=2) in ("Gamma", "river", "Beta")


def test_yes_no_come_from_the_type_head(tokenizer):
    example = _example("yes")
    features = _window(example, tokenizer)
    paris = _token(features, "Paris", example)
    strong_span = {"start": {paris: 30.0}, "end": {paris: 30.0}}
    assert decode_answer(example, [_scores(features, (0.0, 3.0, 1.0), **strong_span)], 30) == "yes"
    assert decode_answer(example, [_scores(features, (0.0, 1.0, 3.0), **strong_span)], 30) == "no"
    assert decode_answer(example, [_scores(features, (3.0, 1.0, 1.0), **strong_span)], 30) == "Paris"
    # Over windows the type probabilities are averaged.
    two = [_scores(features, (0.0, 4.0, 0.0)), _scores(features, (2.0, 0.0, 0.0))]
    assert decode_answer(example, two, 30) == "yes"


def test_supporting_facts_by_threshold(tokenizer):
    example = _example()
    features = _window(example, tokenizer)
    sentence_globals = [g for g, kind in enumerate(features.global_kinds) if kind == GlobalKind.SENTENCE]
    logit = lambda p: math.log(p / (1 - p))  # noqa: E731
    sp = dict(zip(sentence_globals, (logit(0.2), logit(0.7), logit(0.55), logit(0.4))))
    probabilities = sentence_probabilities(example, [_scores(features, sp=sp)])
    assert list(probabilities) == [("Alpha", 0), ("Alpha", 1), ("Gamma", 0), ("Gamma", 1)]
    assert select_facts(probabilities, 0.5) == [["Alpha", 1], ["Gamma", 0]]
    assert select_facts(probabilities, 0.6) == [["Alpha", 1]]
    assert select_facts(probabilities, 0.3) == [["Alpha", 1], ["Gamma", 0], ["Gamma", 1]]
    # Gold is Alpha 1 + Gamma 0: thresholds in (0.4, 0.55] give both and nothing else; 0.5 is the lowest on the grid.
    threshold, joint_f1 = choose_sp_threshold([example], {"q1": "Paris"}, [probabilities])
    assert threshold == 0.5 and joint_f1 == 1.0


def test_a_wikihop_file_is_refused(shared_data, tokenizer):
    config = GlobalLocalConfig(vocab_size=tokenizer.vocab_size, hidden_size=8, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=8, long_max_len=256, global_max_len=128)
    config.task_options = HotpotQAModel.default_task_options
    with pytest.raises(InputError, match=r"wikihop_train.first22.json.*'_id'"):
        training_features(shared_data / WIKIHOP_SAMPLE, tokenizer, config, progress=False)


def _tiny_encoder(directory, tokenizer, long_max_len=512):
    return write_encoder(directory, tokenizer, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, local_radius=16, long_max_len=long_max_len, global_max_len=128)


@pytest.fixture()
def small_sample(shared_data, tmp_path):
    """The first 12 examples of the real sample (keeps the run short on 2 cores)."""
    path = tmp_path / "hotpot_first12.json"
    path.write_text(json.dumps(json.loads((shared_data / SAMPLE).read_text())[:12]))
    return path


def _official_scores(gold_path, prediction_path) -> dict[str, float]:
    """HotpotQA's official metrics of a prediction file, computed as hotpot_evaluate_v1.py computes
    them (its normalisation, yes/no/noanswer rule, supporting facts as sets, joint scores as products),
    written here apart from longdoc's metric so that the two check each other."""
    punctuation = set(string.punctuation)

    def normal(text):
        text = "".join(ch for ch in text.lower() if ch not in punctuation)
        return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())

    def answer_scores(predicted, gold):
        predicted, gold = normal(predicted), normal(gold)
        if predicted != gold and (predicted in ("yes", "no", "noanswer") or gold in ("yes", "no", "noanswer")):
            return float(predicted == gold), 0.0, 0.0, 0.0
        same = sum((Counter(predicted.split()) & Counter(gold.split())).values())
        if same == 0:
            return float(predicted == gold), 0.0, 0.0, 0.0
        prec, recall = same / len(predicted.split()), same / len(gold.split())
        return float(predicted == gold), 2 * prec * recall / (prec + recall), prec, recall

    def fact_scores(predicted, gold):
        predicted, gold = set(map(tuple, predicted)), set(map(tuple, gold))
        tp, fp, fn = len(predicted & gold), len(predicted - gold), len(gold - predicted)
        prec = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / (tp + fn) if tp + fn else 0.0
        return float(fp + fn == 0), 2 * prec * recall / (prec + recall) if prec + recall else 0.0, prec, recall

    gold, prediction = json.loads(gold_path.read_text()), json.loads(prediction_path.read_text())
    totals = Counter()
    for example in gold:
        em, f1, prec, recall = answer_scores(prediction["answer"][example["_id"]], example["answer"])
        sp_em, sp_f1, sp_prec, sp_recall = fact_scores(prediction["sp"][example["_id"]], example["supporting_facts"])
        joint_prec, joint_recall = prec * sp_prec, recall * sp_recall
        joint_f1 = 2 * joint_prec * joint_recall / (joint_prec + joint_recall) if joint_prec + joint_recall else 0.0
        totals.update(em=em, f1=f1, prec=prec, recall=recall, sp_em=sp_em, sp_f1=sp_f1, sp_prec=sp_prec,
                      sp_recall=sp_recall, joint_em=em * sp_em, joint_f1=joint_f1, joint_prec=joint_prec,
                      joint_recall=joint_recall)
    return {name: total / len(gold) for name, total in totals.items()}


def _assert_official_scores(metrics, gold_path, prediction_path):
    expected = _official_scores(gold_path, prediction_path)
    assert {name: metrics[name] for name in expected} == pytest.approx(expected, abs=1e-12)


@pytest.mark.slow
def test_short_training_run_predict_and_evaluate(small_sample, tokenizer, tmp_path, capsys):
    data, out = small_sample, tmp_path / "run"
    encoder = _tiny_encoder(tmp_path / "encoder", tokenizer, long_max_len=256)
    assert main(["train", "hotpotqa", "--config", "cpu", "--train", str(data), "--dev", str(data), "--out", str(out),
                 "--init", str(encoder), "--long-max-len", "256", "--global-max-len", "128", "--stride", "32",
                 "--max-steps", "30", "--batch-size", "4", "--lr", "1e-3", "--log-steps", "5", "--seed", "0"]) == 0
    losses = logged_losses(out)
    with capsys.disabled():
        print(f"\nhotpotqa training loss (engine log, mean of steps 1-5 vs 26-30): before {losses[0]:.4f} "
              f"after {losses[-1]:.4f}")
    assert len(losses) == 6 and losses[-1] < 0.9 * losses[0]
    # The engine predicted on dev before saving: the threshold chosen there is in the saved model.
    saved = json.loads((out / "config.json").read_text())
    assert saved["task"] == "hotpotqa" and saved["task_options"]["sp_threshold"] in SP_THRESHOLD_GRID
    assert saved["task_options"]["type_from_question"] is False
    # The run's dev scores are the official metric of the dev predictions it wrote beside them.
    _assert_official_scores(json.loads((out / "metrics.json").read_text())["metrics"], data,
                            out / "dev_predictions.json")

    prediction = tmp_path / "pred.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the stored threshold is used; a format problem would warn in evaluate
        assert main(["predict", "hotpotqa", "--model", str(out), "--data", str(data), "--out", str(prediction)]) == 0
        assert main(["evaluate", "hotpotqa", "--gold", str(data), "--pred", str(prediction), "--json"]) == 0
    _assert_official_scores(json.loads(capsys.readouterr().out.strip().splitlines()[-1]), data, prediction)
    assert json.loads(prediction.read_text()) == json.loads((out / "dev_predictions.json").read_text())

    predicted = json.loads(prediction.read_text())
    gold = json.loads(data.read_text())
    assert set(predicted["answer"]) == set(predicted["sp"]) == {e["_id"] for e in gold}
    for example in gold:
        context = {title: sentences for title, sentences in example["context"]}
        answer = predicted["answer"][example["_id"]]
        assert answer in ("yes", "no") or (answer and any(answer in "".join(s) for s in context.values())), answer
        for title, index in predicted["sp"][example["_id"]]:
            assert title in context and 0 <= index < len(context[title])


def test_train_refuses_a_missing_init(small_sample, tmp_path, capsys):
    missing = tmp_path / "no-such-encoder"
    assert main(["train", "hotpotqa", "--train", str(small_sample), "--out", str(tmp_path / "run"),
                 "--init", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err


def test_train_names_the_flags_when_the_stride_does_not_fit_the_window(small_sample, tokenizer, tmp_path, capsys):
    # Windows of 150 long tokens hold 150 - 64 (question) - 3 = 83 context tokens: the default
    # overlap of 128 cannot fit; the error says which flags set the numbers, before any training.
    encoder = _tiny_encoder(tmp_path / "encoder", tokenizer)
    assert main(["train", "hotpotqa", "--train", str(small_sample), "--out", str(tmp_path / "run"),
                 "--init", str(encoder), "--long-max-len", "150"]) == 2
    error = capsys.readouterr().err
    assert "hotpotqa windows (--long-max-len 150, --global-max-len 128, --stride 128, --max-question-len 64)" in error
    assert "stride must be in [0, 83)" in error and "Traceback" not in error
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_predict_refuses_a_bare_encoder_and_a_wrong_file(shared_data, tokenizer, tmp_path, capsys):
    encoder = _tiny_encoder(tmp_path / "encoder", tokenizer)
    assert main(["predict", "hotpotqa", "--model", str(encoder), "--data", str(shared_data / SAMPLE),
                 "--out", str(tmp_path / "p.json")]) == 2
    assert "bare encoder" in capsys.readouterr().err
    torch.manual_seed(0)
    HotpotQAModel.from_encoder(encoder).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    assert main(["predict", "hotpotqa", "--model", str(tmp_path / "model"), "--data",
                 str(shared_data / WIKIHOP_SAMPLE), "--out", str(tmp_path / "p.json")]) == 2
    error = capsys.readouterr().err
    assert "wikihop_train.first22.json" in error and "'_id'" in error
    assert main(["predict", "wikihop", "--model", str(tmp_path / "model"), "--data",
                 str(shared_data / WIKIHOP_SAMPLE), "--out", str(tmp_path / "p.json")]) == 2
    assert "trained hotpotqa model, not a wikihop model" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_answers_missing_from_the_context_are_counted_and_not_span_targets(tokenizer, tmp_path):
    record = {"_id": "x1", "question": "Which river?", "answer": "Danube", "type": "bridge", "level": "hard",
              "supporting_facts": [["Alpha", 0]],
              "context": [["Alpha", ["Alpha is a town.", " It lies on a river."]], ["Gamma", ["Gamma is big."]]]}
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps([record, {**record, "_id": "x2", "answer": "yes"}]))
    config = GlobalLocalConfig(vocab_size=tokenizer.vocab_size, hidden_size=8, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=8, long_max_len=256, global_max_len=96)
    config.task_options = dict(HotpotQAModel.default_task_options)
    with pytest.warns(UserWarning, match=r"hotpot.json: 1 of 1 span answers do not occur in their context"):
        rows = training_features(path, tokenizer, config, progress=False)
    assert [(row["answer_type"], row["start_positions"]) for row in rows] == [(0, -1), (1, -1)]


def test_the_type_head_reads_cls_and_with_type_from_question_also_the_question():
    def tiny(**task_options):
        config = GlobalLocalConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
        config.task_options = task_options
        return config

    # A config.json without the option (all models saved before it existed): CLS alone, as ETC.
    assert HotpotQAModel(tiny()).type_head.projection.in_features == 16
    model = HotpotQAModel(tiny(type_from_question=True))  # [CLS; mean of the question's global tokens]
    assert model.type_head.projection.in_features == 32


@pytest.mark.slow  # `longdoc predict` on 8 questions of the sample
def test_predict_writes_the_type_and_sentence_probabilities_and_the_browser_shows_them(shared_data, tokenizer,
                                                                                      tmp_path):
    gold, pred = model_predictions("hotpotqa", shared_data, tokenizer, tmp_path, first=8)
    _, *first_records = [json.loads(line) for line in scores_path(pred).read_text().splitlines()]
    # A threshold halfway between the two middle values of the sentence probabilities the model wrote
    # splits the sentences by construction: the facts are the upper half, whatever the weights are.
    probabilities = sorted({p for record in first_records for _, _, p in record["sentences"]})
    threshold = sum(probabilities[len(probabilities) // 2 - 1:len(probabilities) // 2 + 1]) / 2
    expected_facts = {record["id"]: [[title, index] for title, index, p in record["sentences"] if p >= threshold]
                      for record in first_records}
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    config["task_options"]["sp_threshold"] = threshold
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    assert main(["--quiet", "predict", "hotpotqa", "--model", str(tmp_path / "model"), "--data", str(gold),
                 "--out", str(pred)]) == 0
    predicted = json.loads(pred.read_text())
    header, *records = [json.loads(line) for line in scores_path(pred).read_text().splitlines()]
    assert predicted["sp"] == expected_facts and [r["sp_threshold"] for r in records] == [threshold] * len(records)
    assert [r["sentences"] for r in records] == [r["sentences"] for r in first_records]
    examples = json.loads(gold.read_text())
    assert header["scores_of"] == pred.name and [r["id"] for r in records] == [e["_id"] for e in examples]
    for record, example in zip(records, examples):
        types = record["answer_type"]
        assert sum(types.values()) == pytest.approx(1.0)
        kind = max(types, key=types.get)
        answer = predicted["answer"][record["id"]]
        assert answer == kind if kind != "span" else answer not in ("yes", "no")
        assert [[title, index] for title, index, _ in record["sentences"]] == [
            [title, index] for title, sentences in example["context"] for index in range(len(sentences))]
        # The predicted facts are the sentences at or above the threshold, in context order.
        assert predicted["sp"][record["id"]] == [[title, index] for title, index, p in record["sentences"]
                                                 if p >= record["sp_threshold"]]
    facts = [p >= record["sp_threshold"] for record in records for _, _, p in record["sentences"]]
    assert any(facts) and not all(facts)
    browser = get_task("hotpotqa").load("browse").open_browser(gold, [pred])
    record = records[1]
    view = browser.view(record["id"])
    assert dict(view.run_fields[0])["answer type"] == " · ".join(f"{kind} {p:.1%}"
                                                                 for kind, p in record["answer_type"].items())
    (table,) = view.tables
    probabilities = {(title, index): p for title, index, p in record["sentences"]}
    shown = [((title, int(index)), float(p)) for title, index, _, _, p in table.rows]
    assert [p for _, p in shown] == sorted((p for _, p in shown), reverse=True)
    assert all(p == pytest.approx(probabilities[fact], abs=5e-5) for fact, p in shown)
    gold_facts = {tuple(fact) for fact in examples[1]["supporting_facts"]}
    assert {(title, int(index)) for title, index, mark, *_ in table.rows if mark == "gold"} == gold_facts
