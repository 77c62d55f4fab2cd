"""Examples -> every window scored by a task model, grouped per example: the part of every task's
`predict` that is the same (each task's decoder then turns an example's window scores into its
official prediction record)."""

from collections.abc import Sized
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from itertools import islice
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from longdoc.data.examples import StructuredExample
from longdoc.errors import InputError
from longdoc.data.features import FeatureSettings, Features, GlobalMarkers, build_features
from longdoc.model.task_model import length_batches


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


@dataclass(frozen=True)
class Pack:
    """Examples whose windows are run together (batched among themselves, never with other
    examples'), by their index in the examples given; its windows; and its cost, the positions its
    batches run (rows x padded length, summed over its batches)."""

    examples: tuple[int, ...]
    windows: int
    cost: int


def example_packs(lengths: Sequence[Sequence[int]], batch_size: int) -> list[Pack]:
    """The examples whose windows have `lengths` (one list per example), in packs: the examples
    sorted by their longest window (longest first; ties in their order), then taken in that order
    while a pack holds at most `batch_size` windows (an example with more windows is a pack alone).

    A window's floats depend on the batch it is run in (its padding and the batch's shape change the
    sums' last bits), and a pack's batches depend on the pack alone, so whichever process runs a pack
    gets the bytes one process gets; torchrun's processes share packs out
    (longdoc.data.shared_prediction), so an example's windows stay in one process."""
    order = sorted(range(len(lengths)), key=lambda e: -max(lengths[e], default=0))
    groups: list[list[int]] = []
    for example in order:
        if groups and sum(len(lengths[e]) for e in groups[-1]) + len(lengths[example]) <= batch_size:
            groups[-1].append(example)
        else:
            groups.append([example])
    packs = []
    for group in groups:
        pack_lengths = [length for e in group for length in lengths[e]]
        cost = sum(len(batch) * max(pack_lengths[i] for i in batch)
                   for batch in length_batches(pack_lengths, batch_size))
        packs.append(Pack(tuple(group), len(pack_lengths), cost))
    return packs


def pack_rows(pack: Pack, rows: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The model-input rows of a pack's windows, its examples' in the pack's order (`rows`: per example)."""
    return [row for e in pack.examples for row in rows[e]]


def pack_outputs(pack: Pack, window_counts: Sequence[int], outputs: Sequence[dict[str, Tensor]]
                 ) -> Iterator[tuple[int, list[dict[str, Tensor]]]]:
    """(example, its windows' outputs) for each example of a pack, from the outputs of `pack_rows`."""
    start = 0
    for e in pack.examples:
        yield e, list(outputs[start:start + window_counts[e]])
        start += window_counts[e]


def score_examples(
    model, examples: Iterable[StructuredExample], *, tokenizer, settings: FeatureSettings,
    inputs: Callable[[StructuredExample, Features], dict[str, Any]], collate: Callable, batch_size: int,
    progress: bool = True, desc: str = "predicting", chunk_size: int | None = None,
) -> Iterator[tuple[StructuredExample, list[WindowScores]]]:
    """Each example of `examples`, in order, with the scores of its windows.

    The windows are `build_features(example, tokenizer, settings)`; `inputs(example, features)` is
    one window's model-input row and `collate` batches rows (both the task's features module's);
    `model.forward_rows` runs them pack by pack (`example_packs`), `batch_size` at a time (floating
    outputs come back as float32 on the CPU, whatever the model's device and dtype). Examples are
    run `chunk_size` at a time (None: all at once), so that the windows of a large file need not all
    be held at once. The progress bar counts examples, and windows beside them. Outputs holding NaN
    or +infinity are refused (`refuse_non_finite`), before anything is decoded from them.

    A model that scores chunks itself (`score_chunk`, as torchrun's processes share them out:
    longdoc.data.shared_prediction) is given each chunk; it yields the examples it returns.
    """
    markers = GlobalMarkers.from_tokenizer(tokenizer)
    task = ChunkTask(lambda example: build_features(example, tokenizer, settings, markers), inputs, collate,
                     batch_size)
    score = getattr(model, "score_chunk", None) or partial(score_chunk, model)
    total = len(examples) if isinstance(examples, Sized) else None
    examples = iter(examples)
    with tqdm(desc=desc, total=total, unit=" examples", disable=not progress) as bar:
        shown = Progress(bar)
        while chunk := list(islice(examples, chunk_size)):
            yield from score(chunk, task, shown)


@dataclass(frozen=True)
class ChunkTask:
    """How a chunk of examples is scored: `windows(example)` its windows' features, `inputs(example,
    features)` a window's model-input row, `collate` and `batch_size` how rows are batched."""

    windows: Callable[[StructuredExample], list[Features]]
    inputs: Callable[[StructuredExample, Features], dict[str, Any]]
    collate: Callable
    batch_size: int


class Progress:
    """A prediction's progress bar: the examples scored, and the windows run beside them."""

    def __init__(self, bar: tqdm):
        self.bar, self.examples, self.windows = bar, 0, 0

    def advance(self, examples: int, windows: int) -> None:
        self.show(self.examples + examples, self.windows + windows)

    def show(self, examples: int, windows: int) -> None:
        """Show these totals (of every process, under torchrun)."""
        self.bar.update(examples - self.examples)
        self.examples, self.windows = examples, windows
        self.bar.set_postfix_str(f"{windows} windows")


def score_chunk(model, chunk: list[StructuredExample], task: ChunkTask, progress: Progress
                 ) -> list[tuple[StructuredExample, list[WindowScores]]]:
    """One process's scoring of a chunk: its examples' windows built, run pack by pack, checked."""
    windows = [task.windows(example) for example in chunk]
    rows = [[task.inputs(example, features) for features in example_windows]
            for example, example_windows in zip(chunk, windows)]
    outputs: list[list[dict[str, Tensor]]] = [[] for _ in chunk]
    for pack in example_packs([window_lengths(example_windows) for example_windows in windows], task.batch_size):
        results = model.forward_rows(pack_rows(pack, rows), task.collate, task.batch_size, progress=False)
        for e, example_outputs in pack_outputs(pack, [len(example_rows) for example_rows in rows], results):
            outputs[e] = example_outputs
        progress.advance(len(pack.examples), pack.windows)
    for example, example_outputs in zip(chunk, outputs):
        for output in example_outputs:
            refuse_non_finite(example.id, output)
    return [(example, [WindowScores(features, output) for features, output in zip(example_windows, example_outputs)])
            for example, example_windows, example_outputs in zip(chunk, windows, outputs)]


def window_lengths(windows: Sequence[Features]) -> list[int]:
    """The long-input length of each of an example's windows: what packs and batches are made by."""
    return [len(features.long_input_ids) for features in windows]


def refuse_non_finite(example_id: str, outputs: Mapping[str, Tensor]) -> None:
    """InputError naming the example when one of its window's floating outputs holds NaN or +infinity:
    decoded, they give empty answers and NaN scores, which no JSON file can hold. (-infinity is a logit's
    "impossible", which a softmax turns into 0.)"""
    for name, value in outputs.items():
        if value.is_floating_point() and bool(torch.isnan(value).any() or torch.isposinf(value).any()):
            raise InputError(f"example {example_id!r}: the model's {name} hold NaN or +infinity; its weights are "
                             "damaged, or the training run that saved it diverged")
