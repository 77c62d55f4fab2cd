"""Examples -> every window scored by a task model, each example decoded by the task's decoder as
soon as its windows are scored: the part of every task's `predict` that is the same
(`decode_examples`; each task's decoder turns an example's window scores into what its official
prediction file and scores side file keep)."""

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


def pack_rows(pack: Pack, rows: Mapping[int, Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The model-input rows of a pack's windows, its examples' in the pack's order (`rows`: per example)."""
    return [row for e in pack.examples for row in rows[e]]


# A bad example met while scoring: (its index among the examples, the error's words); None: none met.
Problem = tuple[int, str] | None


def refuse_first(problems: Iterable[Problem]) -> None:
    """InputError for the first bad example (by its index) of those met: the one a single process,
    reading the examples in order, refuses."""
    met = [problem for problem in problems if problem is not None]
    if met:
        raise InputError(min(met)[1])


@dataclass(frozen=True)
class ChunkTask:
    """How examples are scored and decoded: `windows(example)` its windows' features, `inputs(example,
    features)` a window's model-input row, `collate` and `batch_size` how rows are batched,
    `decode(example, window scores)` what is kept of an example once its windows are scored."""

    windows: Callable[[StructuredExample], list[Features]]
    inputs: Callable[[StructuredExample, Features], dict[str, Any]]
    collate: Callable
    batch_size: int
    decode: Callable[[StructuredExample, list["WindowScores"]], Any]

    def run_pack(self, model, pack: Pack, examples: Mapping[int, StructuredExample],
                 windows: Mapping[int, list[Features]]) -> list[dict[str, Tensor]]:
        """The outputs of a pack's windows (`pack_rows` order), batched among themselves."""
        rows = {e: [self.inputs(examples[e], features) for features in windows[e]] for e in pack.examples}
        return model.forward_rows(pack_rows(pack, rows), self.collate, self.batch_size, progress=False)

    def decode_pack(self, pack: Pack, examples: Mapping[int, StructuredExample], windows: Mapping[int, list[Features]],
                    outputs: Sequence[dict[str, Tensor]]) -> tuple[dict[int, Any], Problem]:
        """({example: decoded} of a pack's examples, from `run_pack`'s outputs; the first bad example
        (by index) of the pack, if any: outputs that are not finite (`refuse_non_finite`) or an
        example the decoder refuses)."""
        decoded, problems, start = {}, [], 0
        for e in pack.examples:  # (the pack's order: longest first, not the examples')
            example_outputs = outputs[start:start + len(windows[e])]
            start += len(windows[e])
            try:
                for output in example_outputs:
                    refuse_non_finite(examples[e].id, output)
                decoded[e] = self.decode(examples[e], [WindowScores(features, output)
                                                      for features, output in zip(windows[e], example_outputs)])
            except InputError as error:
                problems.append((e, str(error)))
        return decoded, min(problems, default=None)


def decode_examples(
    model, examples: Sequence[StructuredExample] | Callable[[], Iterable[StructuredExample]], *,
    decode: Callable[[StructuredExample, list[WindowScores]], Any], tokenizer, settings: FeatureSettings | None = None,
    windows: Callable[[StructuredExample], list[Features]] | None = None,
    inputs: Callable[[StructuredExample, Features], dict[str, Any]], collate: Callable, batch_size: int,
    progress: bool = True, desc: str = "predicting", chunk_size: int | None = None,
) -> Iterator[Any]:
    """`decode(example, its windows' scores)` of each example, in order: what a task's decoder keeps
    of an example (its prediction record, its scores), so that no window's features or outputs outlive
    its example's decoding.

    `examples`: a sequence, or a function that reads them anew at each call (a reader that streams).
    The windows are `windows(example)`, by default `build_features(example, tokenizer, settings)`;
    `inputs(example, features)` is one window's model-input row and `collate` batches rows (both the
    task's features module's); `model.forward_rows` runs them pack by pack (`example_packs`),
    `batch_size` at a time (floating outputs come back as float32 on the CPU, whatever the model's
    device and dtype), and each pack's examples are decoded as soon as it has run. Examples are read
    `chunk_size` at a time (None: all at once), so that the windows of a large file need not all be
    held at once. The progress bar counts examples, and windows beside them. Outputs holding NaN or
    +infinity are refused (`refuse_non_finite`), before anything is decoded from them; of several
    bad examples, the first is named.

    A model that decodes examples itself (`decode_examples`, as torchrun's processes share them out:
    longdoc.data.shared_prediction) is given the reader and the task, and yields what it returns.
    """
    if windows is None:
        markers = GlobalMarkers.from_tokenizer(tokenizer)
        windows = lambda example: build_features(example, tokenizer, settings, markers)  # noqa: E731
    task = ChunkTask(windows, inputs, collate, batch_size, decode)
    read = examples if callable(examples) else partial(iter, examples)
    total = len(examples) if isinstance(examples, Sized) else None
    with tqdm(desc=desc, total=total, unit=" examples", disable=not progress) as bar:
        shown = Progress(bar)
        shared = getattr(model, "decode_examples", None)
        if shared is not None:
            yield from shared(read, task, chunk_size, shown)
            return
        examples = iter(read())
        while chunk := list(islice(examples, chunk_size)):
            yield from decode_chunk(model, chunk, task, shown)


def score_examples(model, examples: Iterable[StructuredExample], **options
                   ) -> Iterator[tuple[StructuredExample, list[WindowScores]]]:
    """Each example of `examples`, in order, with the scores of its windows: `decode_examples` keeping
    them whole (for a caller that reads a few examples' windows itself, as `longdoc ask` does)."""
    return decode_examples(model, list(examples), decode=lambda example, windows: (example, windows), **options)


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


def decode_chunk(model, chunk: list[StructuredExample], task: ChunkTask, progress: Progress) -> list[Any]:
    """One process's decoding of a chunk: its examples' windows built, run pack by pack, each pack's
    examples decoded and their windows dropped as soon as it has run; the first bad example refused
    once every pack has run (as torchrun's processes, which run packs in another order, name it)."""
    windows = dict(enumerate(task.windows(example) for example in chunk))
    examples = dict(enumerate(chunk))
    decoded: dict[int, Any] = {}
    problems: list[Problem] = []
    for pack in example_packs([window_lengths(windows[e]) for e in range(len(chunk))], task.batch_size):
        outputs = task.run_pack(model, pack, examples, windows)
        progress.advance(len(pack.examples), pack.windows)
        pack_decoded, problem = task.decode_pack(pack, examples, windows, outputs)
        decoded.update(pack_decoded)
        problems.append(problem)
        for e in pack.examples:
            del windows[e]
        del outputs
    refuse_first(problems)
    return [decoded[e] for e in range(len(chunk))]


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
