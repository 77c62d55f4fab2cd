"""The window policy for inputs longer than the encoder takes.

The document part of the long input (everything after the repeated [CLS] question [SEP] prefix)
is cut into windows of at most `window_len` tokens. Consecutive windows overlap by exactly
`stride` tokens (the meaning of `stride` in transformers' tokenizers): window k starts at
k * (window_len - stride), and the last window ends at the last token (it may be shorter). So every
token lies in at least one window, and a token near a window edge also lies inside a neighbour
whenever `stride` > 0 (NQ-style sliding windows, as in BERT-joint and ETC).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Window:
    """Document tokens [start, end) of one window."""

    start: int
    end: int


def plan_windows(num_tokens: int, window_len: int, stride: int) -> list[Window]:
    """Windows covering tokens [0, num_tokens); one empty window when there are no tokens."""
    if window_len < 1:
        raise ValueError(f"window length must be >= 1, got {window_len}")
    if not 0 <= stride < window_len:
        raise ValueError(f"stride must be in [0, window length {window_len}), got {stride}")
    if num_tokens <= window_len:
        return [Window(0, num_tokens)]
    step = window_len - stride
    windows = []
    start = 0
    while True:
        end = min(start + window_len, num_tokens)
        windows.append(Window(start, end))
        if end == num_tokens:
            return windows
        start += step
