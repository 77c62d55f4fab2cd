"""NQ model outputs over windows -> the official prediction file (nq_eval.py's format).

Per example, over all of its windows (BERT-joint's and ETC's inference, Alberti et al., 2019;
google-research/google-research etcmodel/models/nq/eval_nq_lib.py):

- Scores comparable across windows: every span score is its raw start + end logit minus the same
  window's "no answer" score, the start + end logit at [CLS] (long token 0), where training puts
  the targets of windows without an answer. A window whose logits are all shifted up scores no
  better for it: only how far a span beats that window's own null counts.
- Long answer, snapped to a candidate: each top-level long-answer candidate that lies whole in a
  window scores long_start[first wordpiece] + long_end[last wordpiece] - null; a candidate seen by
  several overlapping windows is one candidate with the best of its window scores. The best
  candidate is the long answer; `long_answer_score` is its score. Its token offsets (and byte
  offsets, in the original format) are the candidate's own.
- Short answer, inside the long answer: over the windows that hold tokens of the chosen
  candidate, the best span of at most `max_short_answer_length` wordpieces whose both ends are
  tokens of that candidate, scored short_start + short_end - the window's short null; mapped to
  document tokens, a span found by two windows is one span with its best score.
  `short_answers_score` is that score.
- yes/no: when the answer-type head of the window that gave the long answer puts YES or NO first
  (of NULL / YES / NO / LONG / SHORT), `yes_no_answer` is that and no short span is given (the
  official format forbids both); `short_answers_score` is then the long answer's score.
Thresholds on the scores are left to the metric, which sweeps them (nq_eval.py).
A document without any top-level candidate gets the null long answer (score 0: no prediction).
"""

from pathlib import Path
from typing import Any, Sequence

import torch

from longdoc.data.examples import StructuredExample
from longdoc.data.features import Features, GlobalKind
from longdoc.data.prediction import PredictionFile, WindowScores, decode_examples
from longdoc.io import atomic_write_json
from longdoc.model.heads import top_spans
from longdoc.tasks.nq import NQOptions
from longdoc.tasks.nq.features import (
    ANSWER_TYPES, CHUNK_EXAMPLES, HtmlMarkerTokenizer, collate, document_token_index, feature_settings, window_inputs,
)
from longdoc.tasks.nq.reader import read_examples

NULL_SPAN = {"start_token": -1, "end_token": -1, "start_byte": -1, "end_byte": -1}


def candidate_tokens(example: StructuredExample, features: Features) -> dict[int, tuple[int, int, int]]:
    """{paragraph index: (global token, first long token, last long token)} for every top-level
    candidate (paragraph) with a global token in this window; first/last are -1 when the window
    holds only part of the candidate."""
    paragraphs = example.documents[0].paragraphs
    found = {}
    owned: dict[int, list[int]] = {}
    for position, owner in enumerate(features.sentence_ids):
        if owner >= 0:
            owned.setdefault(owner, []).append(position)
    for g, (kind, item) in enumerate(zip(features.global_kinds, features.global_item_ids)):
        if kind != GlobalKind.PARAGRAPH or g not in owned:
            continue
        first, last = owned[g][0], owned[g][-1]
        span = paragraphs[item].span
        whole = features.long_offsets[first][0] == span.start and features.long_offsets[last][1] == span.end
        found[item] = (g, first, last) if whole else (g, -1, -1)
    return found


def best_long_answer(example: StructuredExample, windows: Sequence[WindowScores]) -> tuple[int, float, int] | None:
    """(paragraph index, score, window index) of the best candidate over all windows; None without any."""
    scores = candidate_scores(example, windows)
    if not scores:
        return None
    paragraph = max(scores, key=lambda p: scores[p][0])
    return paragraph, scores[paragraph][0], scores[paragraph][1]


def candidate_scores(example: StructuredExample, windows: Sequence[WindowScores]) -> dict[int, tuple[float, int]]:
    """{paragraph index: (best score over windows, window index)} of every candidate some window holds whole."""
    scores: dict[int, tuple[float, int]] = {}
    for w, window in enumerate(windows):
        long_start, long_end = window.outputs["long_start_logits"], window.outputs["long_end_logits"]
        null = float(long_start[0] + long_end[0])
        for paragraph, (_, first, last) in candidate_tokens(example, window.features).items():
            if first < 0:
                continue
            score = float(long_start[first] + long_end[last]) - null
            if paragraph not in scores or score > scores[paragraph][0]:
                scores[paragraph] = (score, w)
    return scores


def short_span_scores(example: StructuredExample, windows: Sequence[WindowScores], paragraph: int,
                      max_length: int) -> dict[tuple[int, int], float]:
    """{(start_token, end_token) in document tokens: best score} of the best short span inside
    candidate `paragraph` in each window that holds its tokens (one entry per distinct span)."""
    token_of = document_token_index(example.documents[0].text)
    spans: dict[tuple[int, int], float] = {}
    for window in windows:
        features = window.features
        tokens = candidate_tokens(example, features).get(paragraph)
        if tokens is None:
            continue
        length = len(features.long_input_ids)
        groups = torch.tensor([0 if owner == tokens[0] else -1 for owner in features.sentence_ids])
        short_start, short_end = window.outputs["short_start_logits"], window.outputs["short_end_logits"]
        null = float(short_start[0] + short_end[0])
        for score, first, last in top_spans(short_start[:length], short_end[:length], groups, max_length):
            key = (token_of(features.long_offsets[first][0]), token_of(features.long_offsets[last][1] - 1) + 1)
            spans[key] = max(score - null, spans.get(key, float("-inf")))
    return spans


def _span_record(example: StructuredExample, start_token: int, end_token: int,
                 candidate: dict[str, Any] | None = None) -> dict[str, int]:
    token_bytes = example.labels.get("token_bytes")
    record = {"start_token": start_token, "end_token": end_token, "start_byte": -1, "end_byte": -1}
    if candidate is not None and isinstance(candidate.get("start_byte"), int) and candidate["start_byte"] >= 0:
        record["start_byte"], record["end_byte"] = candidate["start_byte"], candidate["end_byte"]
    elif token_bytes is not None:
        record["start_byte"], record["end_byte"] = token_bytes[start_token][0], token_bytes[end_token - 1][1]
    return record


def decode_example(example: StructuredExample, windows: Sequence[WindowScores], max_short_answer_length: int) -> dict:
    """The official prediction record of one example (see the module docstring)."""
    record = {"example_id": example.labels.get("example_id", example.id), "long_answer": dict(NULL_SPAN),
              "long_answer_score": 0.0, "short_answers": [], "short_answers_score": 0.0, "yes_no_answer": "NONE"}
    best = best_long_answer(example, windows)
    if best is None:
        return record
    paragraph, score, w = best
    candidate = example.labels["long_answer_candidates"][example.labels["top_level_candidates"][paragraph]]
    record["long_answer"] = _span_record(example, candidate["start_token"], candidate["end_token"], candidate)
    record["long_answer_score"] = score
    answer_type = ANSWER_TYPES[int(windows[w].outputs["type_logits"].argmax())]
    if answer_type in ("yes", "no"):
        record["yes_no_answer"] = answer_type.upper()
        record["short_answers_score"] = score
        return record
    spans = short_span_scores(example, windows, paragraph, max_short_answer_length)
    if spans:
        (start, end), short_score = max(spans.items(), key=lambda item: item[1])
        record["short_answers"] = [_span_record(example, start, end)]
        record["short_answers_score"] = short_score
    return record


def predict(model, data_path, out_path, *, tokenizer, options: NQOptions | None = None, tune: bool = False,
            batch_size: int = 8, progress: bool = True) -> PredictionFile:
    """Predict every example of the NQ file `data_path` (either format); write the official
    prediction file {"predictions": [...]} to `out_path` (atomically). Nothing is tuned (thresholds
    are the metric's sweep). Bad lines stop the run unless `options` (a training run's) say
    `skip_bad_lines`.
    Examples are read and run CHUNK_EXAMPLES at a time, so memory does not grow with the file
    beyond the predictions themselves."""
    max_length = model.config.task_options["max_short_answer_length"]
    skip = options is not None and options.skip_bad_lines
    predictions = list(decode_examples(
        model, lambda: read_examples(data_path, skip_bad_lines=skip), tokenizer=HtmlMarkerTokenizer(tokenizer),
        settings=feature_settings(model.config), inputs=lambda _, features: window_inputs(features), collate=collate,
        batch_size=batch_size, progress=progress, desc="predict", chunk_size=CHUNK_EXAMPLES,
        decode=lambda example, windows: decode_example(example, windows, max_length)))
    atomic_write_json(out_path, {"predictions": predictions})
    return PredictionFile(Path(out_path), len(predictions))
