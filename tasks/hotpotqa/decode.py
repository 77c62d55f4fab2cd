"""HotpotQA model outputs -> the official prediction file {"answer": {id: text}, "sp": {id: [[title, i], ...]}}.

Per example, over all of its windows:
- answer type: the argmax of the type probabilities averaged over windows; "yes" and "no" are
  answered as such, from the type head alone;
- span answers: the best start + end logit over spans that lie inside one paragraph's sentences
  (never across paragraphs, never in the question or a title) and are at most
  `max_answer_length` wordpieces long, over all windows; mapped back through the long tokens'
  character offsets to the exact text of the context;
- supporting facts: every sentence whose probability (sigmoid of its logit, the highest over the
  windows that hold it) is at least the threshold, in context order.

The threshold: `options.sp_threshold` when given; else, when asked to tune on a file with gold
supporting facts (the dev file of a training run), the value of `SP_THRESHOLD_GRID` with the best
joint F1 (official metric) on that file, as ETC's HotpotQA runner searches it
(google-research/google-research, etcmodel/models/hotpotqa/run_finetuning.py: 0, 0.1, ..., 1),
returned as chosen (`PredictionFile.chosen`: the training run keeps it in the model it saves);
else the model's stored threshold; else 0.5 (that runner's default).

Beside it, the scores side file (longdoc.data.prediction_scores) holds, per example, the answer
type probabilities and every supporting-sentence probability: {"id", "answer_type": {"span": p,
"yes": p, "no": p}, "sp_threshold": t, "sentences": [[title, sentence index, probability], ...]}
(every sentence some window holds, in context order; those at or above t are the predicted facts).
"""

import sys
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from longdoc.data.examples import StructuredExample, TextSpan
from longdoc.data.features import Features, GlobalKind
from longdoc.data.prediction import PredictionFile, WindowScores, decode_examples
from longdoc.data.prediction_scores import write_scores
from longdoc.data.spans import TokenSpan, token_span_to_char_span
from longdoc.io import atomic_write_json
from longdoc.model.heads import top_spans
from longdoc.tasks.hotpotqa import HotpotQAOptions
from longdoc.tasks.hotpotqa.features import (
    ANSWER_TYPES, collate, feature_settings, sentence_facts, window_inputs,
)
from longdoc.tasks.hotpotqa.metric import evaluate
from longdoc.tasks.hotpotqa.reader import read_examples

DEFAULT_SP_THRESHOLD = 0.5
SP_THRESHOLD_GRID = tuple(step / 10 for step in range(11))


def answer_type(windows: Sequence[WindowScores]) -> tuple[str, Tensor]:
    """(the answer type, the type probabilities [len(ANSWER_TYPES)] averaged over the windows)."""
    probabilities = torch.stack([w.outputs["type_logits"].softmax(-1) for w in windows]).mean(0)
    return ANSWER_TYPES[int(probabilities.argmax())], probabilities


def window_spans(window: WindowScores, max_answer_length: int, k: int = 1) -> list[tuple[float, int, int]]:
    """The k best (start + end logit, first, last) long-token spans of one window that lie inside
    one paragraph's sentences and are at most `max_answer_length` wordpieces long, best first."""
    features = window.features
    length = len(features.long_input_ids)
    is_sentence = [kind == GlobalKind.SENTENCE for kind in features.global_kinds]
    # A span's ends must share a paragraph id and lie on sentence tokens (not question, title, [SEP]).
    groups = torch.tensor([paragraph if owner >= 0 and is_sentence[owner] else -1
                           for owner, paragraph in zip(features.sentence_ids, features.long_paragraph_ids)])
    return top_spans(window.outputs["start_logits"][:length], window.outputs["end_logits"][:length], groups,
                     max_answer_length, k)


def char_span(features: Features, first: int, last: int) -> TextSpan | None:
    """The characters of long tokens first..last in the example's text; None across documents."""
    return token_span_to_char_span(features.long_offsets, features.long_source_ids, TokenSpan(first, last))


def decode_answer(example: StructuredExample, windows: Sequence[WindowScores], max_answer_length: int) -> str:
    """The answer text of one example (see the module docstring)."""
    answer, _ = answer_type(windows)
    if answer != "span":
        return answer
    best = None
    for window in windows:
        for score, first, last in window_spans(window, max_answer_length):
            if best is None or score > best[0]:
                best = (score, window.features, first, last)
    if best is None:
        return ""
    _, features, first, last = best
    return example.text_of(char_span(features, first, last))


def sentence_item_probabilities(windows: Sequence[WindowScores]) -> dict[int, float]:
    """{sentence (its index in the example's flat sentence order, as `global_item_ids` numbers them):
    supporting-fact probability, the highest over the windows that hold it}."""
    probabilities: dict[int, float] = {}
    for window in windows:
        features = window.features
        for g, (kind, item) in enumerate(zip(features.global_kinds, features.global_item_ids)):
            if kind == GlobalKind.SENTENCE:
                probability = float(torch.sigmoid(window.outputs["sp_logits"][g]))
                probabilities[item] = max(probability, probabilities.get(item, 0.0))
    return probabilities


def sentence_probabilities(example: StructuredExample, windows: Sequence[WindowScores]) -> dict[tuple[str, int], float]:
    """{(title, sentence index): supporting-fact probability} for every sentence some window holds."""
    facts = sentence_facts(example)
    probabilities: dict[tuple[str, int], float] = {}
    for item, probability in sentence_item_probabilities(windows).items():
        probabilities[facts[item]] = max(probability, probabilities.get(facts[item], 0.0))
    # Context order, so the prediction file lists facts as the context does.
    return {fact: probabilities[fact] for fact in facts if fact in probabilities}


def select_facts(probabilities: Mapping[tuple[str, int], float], threshold: float) -> list[list]:
    """[title, sentence index] of the facts at or above `threshold`, in context order."""
    return [[title, index] for (title, index), p in probabilities.items() if p >= threshold]


def scores_record(example_id: str, types: Sequence[float], probabilities: Mapping[tuple[str, int], float],
                  threshold: float) -> dict:
    """The scores record of one example (see the module docstring): its type probabilities (`answer_type`'s)."""
    return {"id": example_id, "answer_type": dict(zip(ANSWER_TYPES, types)), "sp_threshold": threshold,
            "sentences": [[title, index, probability] for (title, index), probability in probabilities.items()]}


def choose_sp_threshold(examples: Sequence[StructuredExample], answers: Mapping[str, str],
                        probabilities: Sequence[Mapping[tuple[str, int], float]]) -> tuple[float, float]:
    """(threshold, joint F1) of the value in SP_THRESHOLD_GRID with the best joint F1 against the
    examples' gold labels; the lowest of equals."""
    gold = [{"_id": e.id, "answer": e.labels["answer"], "supporting_facts": e.labels["supporting_facts"]}
            for e in examples]
    best = None
    for threshold in SP_THRESHOLD_GRID:
        sp = {e.id: select_facts(p, threshold) for e, p in zip(examples, probabilities)}
        joint_f1 = evaluate(gold, {"answer": answers, "sp": sp})["joint_f1"]
        if best is None or joint_f1 > best[1]:
            best = (threshold, joint_f1)
    return best


def _sp_threshold(model, given: float | None, tune: bool, data_path, examples, answers,
                  probabilities) -> tuple[float, dict[str, Any]]:
    """(the threshold, what was chosen on this file: {"sp_threshold": ...} or nothing)."""
    if given is not None:
        return float(given), {}
    if tune and all(example.labels.get("supporting_facts") for example in examples):
        threshold, joint_f1 = choose_sp_threshold(examples, answers, probabilities)
        print(f"longdoc: supporting-fact threshold {threshold} chosen on {data_path} (joint F1 {joint_f1:.4f})",
              file=sys.stderr)
        return threshold, {"sp_threshold": threshold}
    stored = model.config.task_options.get("sp_threshold")
    if stored is not None:
        return float(stored), {}
    warnings.warn(f"this model has no supporting-fact threshold chosen on dev; using {DEFAULT_SP_THRESHOLD}",
                  stacklevel=3)
    return DEFAULT_SP_THRESHOLD, {}


def predict(model, data_path, out_path, *, tokenizer, options: HotpotQAOptions | None = None, tune: bool = False,
            batch_size: int = 8, progress: bool = True) -> PredictionFile:
    """Predict every example of the HotpotQA file `data_path`; write the official prediction file
    to `out_path` and the scores beside it (both atomically). `options`: a training run's (its
    `sp_threshold`); `tune`: choose the threshold on this file (see the module docstring)."""
    examples = list(read_examples(data_path))
    max_answer_length = model.config.task_options["max_answer_length"]

    def decode(example: StructuredExample, windows: list[WindowScores]) -> tuple[str, dict, list[float]]:
        """What the files keep of an example: its answer, sentence probabilities and type probabilities."""
        return (decode_answer(example, windows, max_answer_length), sentence_probabilities(example, windows),
                answer_type(windows)[1].tolist())

    decoded = list(decode_examples(
        model, examples, decode=decode, tokenizer=tokenizer, settings=feature_settings(model.config),
        inputs=lambda _, features: window_inputs(features), collate=collate, batch_size=batch_size,
        progress=progress, desc="predict"))
    answers = {example.id: answer for example, (answer, _, _) in zip(examples, decoded)}
    probabilities = [p for _, p, _ in decoded]
    given = None if options is None else options.sp_threshold
    threshold, chosen = _sp_threshold(model, given, tune, data_path, examples, answers, probabilities)
    sp = {example.id: select_facts(p, threshold) for example, p in zip(examples, probabilities)}
    atomic_write_json(out_path, {"answer": answers, "sp": sp})
    scores = write_scores(out_path, (scores_record(example.id, types, p, threshold)
                                     for example, (_, p, types) in zip(examples, decoded)))
    return PredictionFile(Path(out_path), len(examples), chosen, scores)
