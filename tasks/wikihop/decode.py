"""WikiHop model outputs -> the prediction file {id: answer} the QAngaroo leaderboard takes.

The answer is the candidate whose global token scores highest; only the candidate globals of
the example's own window count (padding and the other global tokens never do), so every
prediction is one of the example's candidates, copied from its candidate list.

Beside it, the scores side file (longdoc.data.prediction_scores) holds each candidate's
probability, the softmax over the window's candidate logits (as training's loss takes it):
{"id", "candidates": [{"text", "probability"}, ...]} in the example's candidate order, the
probability null for a candidate whose global token the global budget dropped (it cannot be
chosen). The answer is the first candidate of highest probability.
"""

from pathlib import Path

import torch

from longdoc.data.examples import StructuredExample
from longdoc.data.features import Features, GlobalKind, GlobalMarkers, build_features
from longdoc.data.prediction import PredictionFile, WindowScores, decode_examples
from longdoc.data.prediction_scores import write_scores
from longdoc.io import atomic_write_json
from longdoc.tasks.wikihop.features import (CutCounter, collate, feature_settings, window_inputs,
                                            with_candidate_list)
from longdoc.tasks.wikihop.reader import read_examples


def window_candidates(features: Features, candidate_logits: torch.Tensor) -> list[tuple[int, float]]:
    """(candidate index, logit) of each candidate global token of the window, in global order."""
    return [(item, float(candidate_logits[g]))
            for g, (kind, item) in enumerate(zip(features.global_kinds, features.global_item_ids))
            if kind == GlobalKind.CANDIDATE]


def best_candidate(example: StructuredExample, features: Features, candidate_logits: torch.Tensor) -> str:
    """The text of the highest-scoring candidate among the window's candidate globals (the first
    of equals)."""
    scored = window_candidates(features, candidate_logits)
    if not scored:
        # No candidate global kept (global_max_len too small for even one): fall back to the first.
        return example.candidates[0].text if example.candidates else ""
    best, _ = max(scored, key=lambda pair: pair[1])
    return example.candidates[best].text


def scores_record(example: StructuredExample, features: Features, candidate_logits: torch.Tensor) -> dict:
    """The scores record of one example (see the module docstring)."""
    scored = window_candidates(features, candidate_logits)
    probabilities = [None] * len(example.candidates)
    if scored:
        softmax = torch.tensor([logit for _, logit in scored], dtype=torch.float64).softmax(0)
        for (item, _), probability in zip(scored, softmax.tolist()):
            probabilities[item] = probability
    return {"id": example.id, "candidates": [{"text": candidate.text, "probability": probability}
                                             for candidate, probability in zip(example.candidates, probabilities)]}


def predict(model, data_path, out_path, *, tokenizer, options=None, tune: bool = False, batch_size: int = 8,
            progress: bool = True) -> PredictionFile:
    """Predict every example of the WikiHop file `data_path`; write {id: answer} to `out_path`
    and the candidates' probabilities beside it (both atomically)."""
    examples = list(read_examples(data_path))
    settings = feature_settings(model.config)
    markers = GlobalMarkers.from_tokenizer(tokenizer)
    wordpieces: dict[str, tuple[int, int]] = {}  # per example: (read, in all), from its windows until decoded

    def first_window(example: StructuredExample) -> list[Features]:
        windows = build_features(with_candidate_list(example), tokenizer, settings, markers)
        wordpieces[example.id] = windows[0].window_end, windows[-1].window_end
        return windows[:1]

    def decode(example: StructuredExample, windows: list[WindowScores]) -> tuple[str, dict, tuple[int, int]]:
        """What the files keep of an example: its answer, its scores record, and the wordpieces read of all."""
        (window,) = windows
        logits = window.outputs["candidate_logits"]
        return (best_candidate(example, window.features, logits), scores_record(example, window.features, logits),
                wordpieces.pop(example.id))

    decoded = list(decode_examples(model, examples, decode=decode, tokenizer=tokenizer, windows=first_window,
                                   inputs=lambda _, features: window_inputs(features), collate=collate,
                                   batch_size=batch_size, progress=progress, desc="predict"))
    cuts = CutCounter()
    for _, _, (read, total) in decoded:
        cuts.add(read, total)
    cuts.warn(data_path, settings.long_max_len)
    atomic_write_json(out_path, {example.id: answer for example, (answer, _, _) in zip(examples, decoded)})
    scores = write_scores(out_path, (record for _, record, _ in decoded))
    return PredictionFile(Path(out_path), len(examples), scores=scores)
