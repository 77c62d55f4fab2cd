"""OpenKP end to end: features (DOM-node globals with their visual features, words pooled from
wordpieces, gold n-grams), the n-gram decoder, training, `longdoc predict openkp` scored by
`longdoc evaluate openkp`, bad VDOM input. Real data: the one-page README sample in
../shared/data; synthetic pages are written here (tmp_path) where more are needed."""

import json
import math
import warnings

import pytest
import torch

from longdoc.cli import main
from longdoc.data.features import GlobalKind, GlobalMarkers, build_features
from longdoc.errors import InputError
from longdoc.tasks import get_task
from longdoc.data.prediction import score_examples
from longdoc.data.prediction_scores import scores_path
from longdoc.tasks.openkp.decode import SCORED, phrase_scores, top_phrases, word_window
from longdoc.tasks.openkp.features import (
    MAX_NGRAM, collate, feature_settings, keyphrase_starts, window_inputs, window_row, window_words, words_of,
)
from longdoc.model.heads import MASKED_LOGIT, NgramScorer, pool_linked
from longdoc.tasks.openkp.model import OpenKPModel, ngram_loss
from longdoc.tasks.openkp.reader import read_examples
from tests.tasks.conftest import TINY_ENCODER, write_encoder
from tests.conftest import logged_losses
from tests.tasks.predictions import model_predictions

SAMPLE = "openkp/openkp_readme_example.jsonl"


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory, tokenizer):
    """A tiny random text encoder (no visual features: OpenKPModel.from_encoder adds them)."""
    return write_encoder(tmp_path_factory.mktemp("openkp_encoder"), tokenizer, **TINY_ENCODER, long_max_len=384,
                         global_max_len=96)


def openkp_model(encoder_dir) -> OpenKPModel:
    torch.manual_seed(0)
    return OpenKPModel.from_encoder(encoder_dir, stride=64)


def test_real_sample_features(shared_data, tokenizer, encoder_dir):
    model = openkp_model(encoder_dir)
    assert model.config.global_feature_size == 20
    (example,) = read_examples(shared_data / SAMPLE)
    vdom = json.loads(json.loads((shared_data / SAMPLE).read_text())["VDOM"])
    words = words_of(example)
    windows = build_features(example, tokenizer, feature_settings(model.config), GlobalMarkers.from_tokenizer(tokenizer))
    assert len(windows) >= 2  # 787 words in 384-token windows
    phrases = [p for p in example.labels["KeyPhrases"] if p]
    seen_nodes, seen_targets = set(), 0
    for features in windows:
        # One global token per VDOM node in the window, carrying that node's 20 visual features.
        for kind, item, vector in zip(features.global_kinds, features.global_item_ids, features.global_features):
            if kind == GlobalKind.DOM_NODE:
                assert vector == [float(v) for v in vdom[item]["feature"]]
                seen_nodes.add(item)
            else:
                assert vector == [0.0] * 20
        first, word_ids = window_words(example, features)
        for (start, end), source, word in zip(features.long_offsets, features.long_source_ids, word_ids):
            if source == 0:  # each wordpiece lies inside the word it is pooled into
                assert word >= 0 and example.documents[0].text[start:end] in words[first + word]
            else:
                assert word == -1
        row = window_row(example, features, phrases)
        for n_index, line in enumerate(row["ngram_labels"]):
            for local, value in enumerate(line):
                if value:
                    tokens = [w.lower() for w in words[first + local:first + local + n_index + 1]]
                    assert tokens in [[t.lower() for t in p] for p in phrases]
                    seen_targets += 1
    assert seen_nodes == set(range(len(vdom)))
    occurrences = sum(len(keyphrase_starts(words, p)) for p in phrases)
    assert occurrences > 0 and seen_targets >= occurrences


def test_ngram_decoder_takes_the_max_over_occurrences_and_matches_lowercased():
    words = ["Web", "Application", "for", "web", "application", "users", "", "x"]
    logits = torch.full((MAX_NGRAM, len(words)), -5.0)
    logits[1, 0] = 1.0  # "Web Application" at 0
    logits[1, 3] = 4.0  # "web application" at 3: the same phrase lowercased, better
    logits[0, 5] = 3.0  # "users"
    logits[0, 2] = 2.0  # "for"
    logits[0, 6] = 9.0  # the empty token: never proposed
    logits[1, 5] = 9.0  # "users" + "": never proposed
    windows = [(0, logits)]
    scores = phrase_scores(words, windows)
    assert scores["web application"] == (4.0, ["web", "application"])
    assert "" not in scores and not any(key.endswith(" ") for key in scores)
    assert top_phrases(words, windows, k=3) == [(4.0, ["web", "application"]), (3.0, ["users"]), (2.0, ["for"])]
    # A second window that sees "Web Application" at 0 with a better score: max over windows.
    later = torch.full((MAX_NGRAM, 4), -5.0)
    later[1, 0] = 6.0
    ranked = top_phrases(words, [windows[0], (0, later)], k=5)
    assert ranked[0] == (6.0, ["Web", "Application"])
    assert len({" ".join(p).lower() for _, p in ranked}) == len(ranked) == 5
    assert [score for score, _ in ranked] == sorted((score for score, _ in ranked), reverse=True)


def test_ngram_scorer_scores_each_ngram_from_its_own_words():
    torch.manual_seed(0)
    head = NgramScorer(6, max_n=3)
    words = torch.randn(2, 4, 6)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    scores = head(words, mask)
    assert scores.shape == (2, 3, 4)
    for b, count in enumerate((4, 2)):
        for n in range(1, 4):
            convolution, projection = head.convolutions[n - 1], head.projections[n - 1]
            for i in range(4):
                if i + n > count:
                    assert scores[b, n - 1, i] == MASKED_LOGIT
                    continue
                # Conv1d by hand: out[c] = sum over k, h of W[c, h, k] * words[i + k, h] + bias[c].
                hidden = torch.einsum("chk,kh->c", convolution.weight, words[b, i:i + n]) + convolution.bias
                expected = projection(torch.nn.functional.gelu(hidden))
                torch.testing.assert_close(scores[b, n - 1, i], expected[0])


def test_words_are_mean_pooled_and_the_loss_spreads_over_gold_ngrams():
    hidden = torch.arange(12.0).reshape(1, 6, 2)
    word_ids = torch.tensor([[-1, 0, 0, 1, 1, -1]])  # [CLS] w0 w0 w1 w1 [SEP]
    torch.testing.assert_close(pool_linked(hidden, word_ids, 3), torch.tensor([[[3.0, 4.0], [7.0, 8.0], [0.0, 0.0]]]))
    logits = torch.tensor([[[0.0, 0.0], [0.0, MASKED_LOGIT]]])  # three real (n, start) pairs
    labels = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])  # two gold pairs: half the mass on each
    torch.testing.assert_close(ngram_loss(logits, labels), torch.tensor(math.log(3)))
    assert ngram_loss(logits, torch.zeros_like(labels)) is None


def test_bad_vdom_is_refused_naming_example_and_field(tmp_path):
    record = {"url": "https://example.invalid/synthetic-page", "text": "alpha beta gamma", "KeyPhrases": [["beta"]]}
    path = tmp_path / "synthetic-openkp.jsonl"
    cases = [
        ("{not json", r"'VDOM'.*not a JSON-encoded list"),
        (json.dumps([{"start_idx": 0, "end_idx": 2, "feature": [1.0] * 19}]), r"'VDOM\[0\]\.feature'.*20 numbers"),
        (json.dumps([{"start_idx": 0, "end_idx": 2, "feature": [1.0] * 19 + ["x"]}]), r"'VDOM\[0\]\.feature'"),
        (json.dumps([{"start_idx": 1, "end_idx": 9, "feature": [1.0] * 20}]), r"'VDOM\[0\]'.*end_idx"),
    ]
    for vdom, message in cases:
        path.write_text(json.dumps({**record, "VDOM": vdom}) + "\n")
        with pytest.raises(InputError, match=r"synthetic-openkp.jsonl:1: example 'https://example.invalid/synthetic-page'"
                                             r": field " + message):
            list(read_examples(path))


@pytest.mark.slow
def test_training_lowers_the_loss_and_predictions_score(shared_data, tokenizer, encoder_dir, tmp_path, capsys):
    # The training engine (`longdoc train openkp`) on the real page: its one window with targets
    # (both keyphrases lie in the first 384 tokens), so every step's loss is on the same row.
    out = tmp_path / "run"
    assert main(["train", "openkp", "--init", str(encoder_dir), "--train", str(shared_data / SAMPLE), "--dev",
                 str(shared_data / SAMPLE), "--out", str(out), "--max-steps", "15", "--batch-size", "1",
                 "--lr", "3e-3", "--warmup-ratio", "0", "--log-steps", "1", "--stride", "64"]) == 0
    losses = logged_losses(out)
    print(f"openkp loss on the real page (longdoc train, 15 steps): {losses[0]:.4f} -> {losses[-1]:.4f}")
    assert len(losses) == 15 and losses[-1] < 0.85 * losses[0]
    assert "F1@3" in json.loads((out / "metrics.json").read_text())["metrics"]

    pred = tmp_path / "pred.jsonl"
    assert main(["predict", "openkp", "--model", str(out), "--data", str(shared_data / SAMPLE),
                 "--out", str(pred)]) == 0
    (prediction,) = [json.loads(line) for line in pred.read_text().splitlines()]
    (example,) = read_examples(shared_data / SAMPLE)
    assert prediction["url"] == example.labels["url"] and len(prediction["KeyPhrases"]) == 5
    words = words_of(example)
    for phrase in prediction["KeyPhrases"]:
        assert 1 <= len(phrase) <= MAX_NGRAM and keyphrase_starts(words, phrase)  # occurs in the text
    assert len({" ".join(p).lower() for p in prediction["KeyPhrases"]}) == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no format complaints
        metrics = get_task("openkp").load("metric").evaluate_files(shared_data / SAMPLE, pred)
    # OpenKP's evaluate.py by hand on the one page: of the first k phrases written, how many are gold
    # (lowercased; the gold's empty phrase dropped), over k and over the number of gold phrases.
    gold = {" ".join(phrase).lower() for phrase in example.labels["KeyPhrases"] if phrase}
    written = [" ".join(phrase).lower() for phrase in prediction["KeyPhrases"]]
    for k in (1, 3, 5):
        hits = sum(phrase in gold for phrase in written[:k])
        precision, recall = hits / k, hits / len(gold)
        f1 = 2 * precision * recall / (precision + recall) if hits else 0.0
        assert [metrics[f"P@{k}"], metrics[f"R@{k}"], metrics[f"F1@{k}"]] == pytest.approx([precision, recall, f1])
    assert json.loads((out / "metrics.json").read_text())["metrics"]["F1@3"] == pytest.approx(metrics["F1@3"])
    # A prediction with a known score: the two gold phrases 2nd and 5th among three the model wrote that
    # are not gold. P@3 1/3, R@3 1/2, F1@3 2/5; P@5 2/5, R@5 1, F1@5 4/7.
    first, second = [phrase for phrase in example.labels["KeyPhrases"] if phrase]
    others = [phrase for phrase in prediction["KeyPhrases"] if " ".join(phrase).lower() not in gold]
    known = tmp_path / "known.jsonl"
    known.write_text(json.dumps({"url": prediction["url"], "KeyPhrases": [
        others[0], first, others[1], others[2], [token.lower() for token in second]]}) + "\n")
    capsys.readouterr()
    assert main(["evaluate", "openkp", "--gold", str(shared_data / SAMPLE), "--pred", str(known), "--json"]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [scores["F1@3"], scores["F1@5"]] == pytest.approx([2 / 5, 4 / 7])


@pytest.mark.slow  # `longdoc predict` on the whole sample (5 s on 2 busy cores)
def test_predict_writes_the_written_keyphrases_scores_in_their_order(shared_data, tokenizer, tmp_path):
    gold, pred = model_predictions("openkp", shared_data, tokenizer, tmp_path)
    (prediction,) = [json.loads(line) for line in pred.read_text().splitlines()]
    header, record = [json.loads(line) for line in scores_path(pred).read_text().splitlines()]
    assert header["scores_of"] == pred.name and record["id"] == prediction["url"]
    # The side file's ranking begins with the official file's, phrase for phrase, best score first, then
    # goes on to the phrases the model ranked next (where a gold phrase it did not write stands).
    assert [entry["phrase"] for entry in record["keyphrases"][:5]] == prediction["KeyPhrases"]
    assert len(record["keyphrases"]) == SCORED == 20
    ranked = [entry["score"] for entry in record["keyphrases"]]
    assert ranked == sorted(ranked, reverse=True)
    # Each score is the phrase's best n-gram logit, as the decoder ranks phrases.
    model = OpenKPModel.from_pretrained(tmp_path / "model").eval()
    (example,) = read_examples(gold)
    (_, windows), = score_examples(model, [example], tokenizer=tokenizer, settings=feature_settings(model.config),
                                   inputs=window_inputs, collate=collate, batch_size=8, progress=False)
    best = phrase_scores(words_of(example), [word_window(example, window) for window in windows])
    for entry in record["keyphrases"]:
        assert best[" ".join(entry["phrase"]).lower()] == (pytest.approx(entry["score"]), entry["phrase"])
    assert max(score for score, _ in best.values()) == pytest.approx(ranked[0])
