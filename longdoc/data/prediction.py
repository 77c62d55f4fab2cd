"""Examples -> every window scored by a task model, grouped per example: the part of every task's
`predict` that is the same (each task's decoder then turns an example's window scores into its
official prediction record)."""

from dataclasses import dataclass, field
from pathlib import Path
from itertools import islice
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
from torch import Tensor
from tqdm.auto import tqdm

from longdoc.data.examples import StructuredExample
from longdoc.errors import InputError
from longdoc.data.features import FeatureSettings, Features, GlobalMarkers, build_features


@dataclass(frozen=True)
class PredictionFile:
    """What a task's `predict` wrote: the official prediction file, the number of examples it
    predicted (so that a caller need not read the data again to count them), the settings it
    chose on the file when asked to tune them (e.g. {"sp_threshold": 0.3}; the caller decides where
    they are kept: a training run stores them in the model it saves), and the scores side file
    written beside it (longdoc.data.prediction_scores; None for a task whose official file holds
    its scores)."""

    path: Path
    examples: int
    chosen: Mapping[str, Any] = field(default_factory=dict)
    scores: Path | None = None


@dataclass
class WindowScores:
    """One window of an example and the model's outputs on it, by output name (the task model's
    typed output, e.g. "start_logits"; a sequence output may run past the window's own length:
    batch padding)."""

    features: Features
    outputs: dict[str, Tensor]


def score_examples(
    model, examples: Iterable[StructuredExample], *, tokenizer, settings: FeatureSettings,
    inputs: Callable[[StructuredExample, Features], dict[str, Any]], collate: Callable, batch_size: int,
    progress: bool = True, desc: str = "predicting", chunk_size: int | None = None,
) -> Iterator[tuple[StructuredExample, list[WindowScores]]]:
    """Each example of `examples`, in order, with the scores of its windows.

    The windows are `build_features(example, tokenizer, settings)`; `inputs(example, features)` is
    one window's model-input row and `collate` batches rows (both the task's features module's);
    `model.forward_rows` runs them `batch_size` at a time (floating outputs come back as float32 on
    the CPU, whatever the model's device and dtype). Examples are run `chunk_size` at a time (None:
    all at once), so that the windows of a large file need not all be held at once; the progress bar
    then counts examples, else windows. Outputs holding NaN or +infinity are refused
    (`refuse_non_finite`), before anything is decoded from them.
    """
    markers = GlobalMarkers.from_tokenizer(tokenizer)
    examples = iter(examples)
    with tqdm(desc=desc, unit=" examples", disable=not progress or chunk_size is None) as bar:
        while chunk := list(islice(examples, chunk_size)):
            windows = [(e, features) for e, example in enumerate(chunk)
                       for features in build_features(example, tokenizer, settings, markers)]
            outputs = model.forward_rows([inputs(chunk[e], features) for e, features in windows], collate, batch_size,
                                         progress=progress and chunk_size is None, desc=desc)
            per_example: list[list[WindowScores]] = [[] for _ in chunk]
            for (e, features), output in zip(windows, outputs):
                refuse_non_finite(chunk[e].id, output)
                per_example[e].append(WindowScores(features, output))
            yield from zip(chunk, per_example)
            bar.update(len(chunk))


def refuse_non_finite(example_id: str, outputs: Mapping[str, Tensor]) -> None:
    """InputError naming the example when one of its window's floating outputs holds NaN or +infinity:
    decoded, they give empty answers and NaN scores, which no JSON file can hold. (-infinity is a logit's
    "impossible", which a softmax turns into 0.)"""
    for name, value in outputs.items():
        if value.is_floating_point() and bool(torch.isnan(value).any() or torch.isposinf(value).any()):
            raise InputError(f"example {example_id!r}: the model's {name} hold NaN or +infinity; its weights are "
                             "damaged, or the training run that saved it diverged")
