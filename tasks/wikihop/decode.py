"""WikiHop model outputs -> the prediction file {id: answer} the QAngaroo leaderboard takes.

The answer is the candidate whose global token scores highest; only the candidate globals of
the example's own window count (padding and the other global tokens never do), so every
prediction is one of the example's candidates, copied from its candidate list.
"""

from pathlib import Path
from typing import Sequence

import torch

from longdoc.data.examples import StructuredExample
from longdoc.data.features import Features, GlobalKind, GlobalMarkers
from longdoc.data.prediction import PredictionFile
from longdoc.io import atomic_write_json
from longdoc.tasks.wikihop.features import CutCounter, collate, example_window, feature_settings, window_inputs
from longdoc.tasks.wikihop.reader import read_examples


def best_candidate(example: StructuredExample, features: Features, candidate_logits: torch.Tensor) -> str:
    """The text of the highest-scoring candidate among the window's candidate globals."""
    candidates: Sequence[tuple[int, int]] = [
        (g, item) for g, (kind, item) in enumerate(zip(features.global_kinds, features.global_item_ids))
        if kind == GlobalKind.CANDIDATE
    ]
    if not candidates:
        # No candidate global kept (global_max_len too small for even one): fall back to the first.
        return example.candidates[0].text if example.candidates else ""
    scores = candidate_logits[[g for g, _ in candidates]]
    return example.candidates[candidates[int(scores.argmax())][1]].text


def predict(model, data_path, out_path, *, tokenizer, options=None, tune: bool = False, batch_size: int = 8,
            progress: bool = True) -> PredictionFile:
    """Predict every example of the WikiHop file `data_path`; write {id: answer} to `out_path`
    (atomically)."""
    examples = list(read_examples(data_path))
    settings = feature_settings(model.config)
    markers = GlobalMarkers.from_tokenizer(tokenizer)
    cuts = CutCounter()
    windows = [example_window(example, tokenizer, settings, markers, cuts) for example in examples]
    cuts.warn(data_path, settings.long_max_len)
    outputs = model.forward_rows([window_inputs(features) for features in windows], collate, batch_size,
                                 progress=progress, desc="wikihop predict")
    answers = {example.id: best_candidate(example, features, output["candidate_logits"])
               for example, features, output in zip(examples, windows, outputs)}
    atomic_write_json(out_path, answers)
    return PredictionFile(Path(out_path), len(examples))
