"""WikiHop pipeline: labels and links, the candidate decoder on hand-made logits, cuts counted, and
a short real run (train on the train sample, predict the dev sample, evaluate)."""

import json
import math
import warnings

import pytest
import torch

from longdoc.cli import main
from longdoc.data.examples import Candidate, Document, StructuredExample
from longdoc.data.features import FeatureSettings, GlobalKind, build_features
from longdoc.data.prediction_scores import scores_path
from longdoc.errors import InputError
from longdoc.model.config import GlobalLocalConfig
from longdoc.tasks.wikihop.decode import best_candidate, scores_record
from longdoc.tasks.wikihop.features import training_features, window_row
from longdoc.tasks.wikihop.model import WikiHopModel
from longdoc.tasks.wikihop.reader import find_mentions
from tests.tasks.conftest import write_encoder
from tests.tasks.predictions import model_predictions
from tests.conftest import logged_losses

TRAIN = "wikihop/wikihop_train.first22.json"
DEV = "wikihop/wikihop_dev.first28.json"
HOTPOT = "hotpotqa/hotpot_dev_distractor_v1.first53.json"


def _example() -> StructuredExample:
    documents = [Document.from_text("Braunschweig is a city in Germany. It is not in Italy."),
                 Document.from_text("SMS Braunschweig was a ship of Germany.")]
    names = ["italy", "germany", "france"]
    return StructuredExample(
        id="WH_x", question="country sms braunschweig", documents=documents,
        candidates=[Candidate(name, find_mentions(name, documents)) for name in names],
        labels={"answer": "germany", "answer_index": 1},
    ).validate()


def _features(example, tokenizer, global_max_len=48):
    settings = FeatureSettings(long_max_len=128, global_max_len=global_max_len, max_question_len=global_max_len - 1)
    return build_features(example, tokenizer, settings)[0]


def test_row_links_mentions_and_labels_the_answer_candidate(tokenizer):
    example = _example()
    features = _features(example, tokenizer)
    row = window_row(example, features)
    candidates = [g for g, kind in enumerate(features.global_kinds) if kind == GlobalKind.CANDIDATE]
    assert len(candidates) == 3
    assert row["candidate_mask"] == [int(g in candidates) for g in range(len(row["candidate_mask"]))]
    assert row["label"] == candidates[1]
    assert all(features.global_sees_all[g] for g in candidates)
    # Both "Germany" mentions link to the germany candidate token.
    linked = [i for i, m in enumerate(features.mention_ids) if m == candidates[1]]
    assert [example.documents[features.long_source_ids[i]].text[slice(*features.long_offsets[i])] for i in linked] \
        == ["Germany", "Germany"]


def test_argmax_over_candidates_ignores_padding_and_other_globals(tokenizer):
    example = _example()
    features = _features(example, tokenizer)
    candidates = [g for g, kind in enumerate(features.global_kinds) if kind == GlobalKind.CANDIDATE]
    logits = torch.zeros(len(features.global_input_ids) + 5)  # padded past the row, as in a batch
    logits[len(features.global_input_ids):] = 100.0  # padding
    logits[0] = 50.0  # CLS
    logits[candidates] = torch.tensor([1.0, -2.0, 3.0])
    assert best_candidate(example, features, logits) == "france"
    logits[candidates[1]] = 4.0
    assert best_candidate(example, features, logits) == "germany"


def test_candidate_dropped_by_the_global_budget_gives_no_label(tokenizer):
    example = _example()
    # CLS + query wordpieces + 2 candidates only.
    budget = 1 + len(tokenizer(example.question, add_special_tokens=False)["input_ids"]) + 2
    with pytest.warns(UserWarning, match="dropped global tokens"):
        features = _features(example, tokenizer, global_max_len=budget)
    example.labels.update(answer="france", answer_index=2)
    assert window_row(example, features)["label"] == -1
    assert best_candidate(example, features, torch.zeros(budget)) in ("italy", "germany")
    # Its probability is null in the scores (it cannot be chosen); the two kept share all of it.
    logits = torch.zeros(budget)
    kept = [g for g, kind in enumerate(features.global_kinds) if kind == GlobalKind.CANDIDATE]
    logits[kept] = torch.tensor([0.0, 1.0])
    record = scores_record(example, features, logits)
    assert record == {"id": "WH_x", "candidates": [
        {"text": "italy", "probability": pytest.approx(1 / (1 + math.e))},
        {"text": "germany", "probability": pytest.approx(math.e / (1 + math.e))},
        {"text": "france", "probability": None}]}
    assert best_candidate(example, features, logits) == "germany"


ENCODER = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, local_radius=16,
               global_max_len=128)


def _config(tokenizer, long_max_len):
    config = GlobalLocalConfig(vocab_size=tokenizer.vocab_size, long_max_len=long_max_len, **ENCODER)
    config.task_options = dict(WikiHopModel.default_task_options)
    return config


def test_cut_supports_are_counted(shared_data, tokenizer):
    with pytest.warns(UserWarning, match=r"wikihop_train.first22.json: \d+ of 22 examples have supports longer than "
                                         r"long_max_len 256 allows; cut after their first window: \d+ of \d+ "
                                         r"wordpieces of candidate list and supports \(\d+\.\d%\) not read"):
        rows = training_features(shared_data / TRAIN, tokenizer, _config(tokenizer, 256), progress=False)
    assert len(rows) == 22 and all(len(row["long_input_ids"]) <= 256 for row in rows)


def test_a_hotpotqa_file_is_refused(shared_data, tokenizer):
    with pytest.raises(InputError, match=r"hotpot_dev_distractor_v1.first53.json.*'id'"):
        training_features(shared_data / HOTPOT, tokenizer, _config(tokenizer, 256), progress=False)


@pytest.mark.slow
def test_short_training_run_predict_and_evaluate(shared_data, tokenizer, tmp_path, capsys):
    encoder = write_encoder(tmp_path / "encoder", tokenizer, **ENCODER, long_max_len=256)
    out, dev = tmp_path / "run", shared_data / DEV
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cut warning, tested above
        assert main(["train", "wikihop", "--config", "cpu", "--train", str(shared_data / TRAIN), "--out", str(out),
                     "--init", str(encoder), "--long-max-len", "256", "--global-max-len", "128",
                     "--max-steps", "40", "--batch-size", "4", "--lr", "1e-3",
                     "--log-steps", "10", "--seed", "0"]) == 0
    losses = logged_losses(out)
    with capsys.disabled():
        print(f"\nwikihop training loss (engine log, mean of steps 1-10 vs 31-40): before {losses[0]:.4f} "
              f"after {losses[-1]:.4f}")
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0]

    prediction = tmp_path / "pred.json"
    assert main(["predict", "wikihop", "--model", str(out), "--data", str(dev), "--out", str(prediction)]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # missing or unknown ids would warn
        assert main(["evaluate", "wikihop", "--gold", str(dev), "--pred", str(prediction), "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out.strip().splitlines()[-1])) == {"accuracy"}
    predicted = json.loads(prediction.read_text())
    gold = json.loads(dev.read_text())
    assert set(predicted) == {e["id"] for e in gold}
    assert all(predicted[e["id"]] in e["candidates"] for e in gold)


@pytest.mark.slow  # `longdoc predict` on the whole sample (5 s on 2 busy cores)
def test_predict_writes_each_candidates_probability_beside_the_answers(shared_data, tokenizer, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cut supports and dropped candidates: tested above
        gold, pred = model_predictions("wikihop", shared_data, tokenizer, tmp_path)
    answers = json.loads(pred.read_text())
    header, *records = [json.loads(line) for line in scores_path(pred).read_text().splitlines()]
    assert header["scores_of"] == pred.name
    examples = json.loads(gold.read_text())
    assert [record["id"] for record in records] == [example["id"] for example in examples] == list(answers)
    for record, example in zip(records, examples):
        assert [c["text"] for c in record["candidates"]] == example["candidates"]
        probabilities = [c["probability"] for c in record["candidates"]]
        assert sum(probabilities) == pytest.approx(1.0) and all(0 < p < 1 for p in probabilities)
        best = max(record["candidates"], key=lambda c: c["probability"])
        assert best["text"] == answers[record["id"]]  # the first of highest probability is the answer
