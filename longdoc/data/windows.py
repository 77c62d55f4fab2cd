"""The window policy for inputs longer than the encoder takes.

The document part of the long input (everything after the repeated [CLS] question [SEP] prefix)
is cut into windows of at most `window_len` tokens that overlap by `stride` tokens (the meaning of
`stride` in transformers' tokenizers): each window starts `stride` tokens before the previous one
ends, and the last ends at the last token. A window edge is only put where `can_cut(i)` allows a
cut before token i (the feature builder forbids cuts inside one character, whose bytes a byte-level
BPE tokenizer may spread over several tokens); an end then moves back and a start moves back, so
the overlap is at least `stride`, never less. So every token lies in at least one window, and a
token near a window edge also lies inside a neighbour whenever `stride` > 0 (NQ-style sliding
windows, as in BERT-joint and ETC).

The window options that tasks share are declared here once, as records a task's options record
extends: `StrideOption` (`stride`), `QuestionLengthOption` (`max_question_len`), `WindowOptions` (both).
"""

from dataclasses import dataclass
from typing import Callable

from longdoc.data.options import option


@dataclass(frozen=True)
class StrideOption:
    stride: int = option(128, "overlap in wordpieces between consecutive windows of an input longer than "
                              "long_max_len")


@dataclass(frozen=True)
class QuestionLengthOption:
    max_question_len: int = option(64, "question wordpieces kept")


@dataclass(frozen=True)
class WindowOptions(QuestionLengthOption, StrideOption):
    """stride, then max_question_len."""


@dataclass(frozen=True)
class Window:
    """Document tokens [start, end) of one window."""

    start: int
    end: int


def plan_windows(
    num_tokens: int, window_len: int, stride: int, can_cut: Callable[[int], bool] = lambda position: True
) -> list[Window]:
    """Windows covering tokens [0, num_tokens); one empty window when there are no tokens."""
    if window_len < 1:
        raise ValueError(f"window length must be >= 1, got {window_len}")
    if not 0 <= stride < window_len:
        raise ValueError(f"stride must be in [0, window length {window_len}), got {stride}")
    windows = []
    start = 0
    while True:
        end = min(start + window_len, num_tokens)
        if end < num_tokens:
            # Back off to an allowed cut; if a whole window has none, cut anyway.
            end = next((cut for cut in range(end, start, -1) if can_cut(cut)), end)
        windows.append(Window(start, end))
        if end == num_tokens:
            return windows
        # The next window starts `stride` tokens back (further back to an allowed cut), always after `start`.
        start = next((cut for cut in range(end - stride, start, -1) if can_cut(cut)), max(end - stride, start + 1))
