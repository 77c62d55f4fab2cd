"""Mapping between character spans of an example's text and long-token spans of one feature window.

Every long token carries its source (a document index, `SOURCE_QUESTION` or `SOURCE_NONE` for
[CLS]/[SEP]/padding) and its character offsets into that source. A gold answer span maps to the
first and last long tokens of the same source that overlap it; mapping back takes the first
token's start and the last token's end. The round trip is exact when the answer starts and ends on
token boundaries (the usual case for wordpiece/BPE tokenisers on word-aligned answers); an answer
cut inside a word comes back widened to the whole tokens.
"""

from dataclasses import dataclass
from typing import Sequence

from longdoc.data.examples import TextSpan

SOURCE_QUESTION = -1
SOURCE_NONE = -2


@dataclass(frozen=True)
class TokenSpan:
    """Long tokens first..last of a window, both inclusive (the convention of span heads)."""

    first: int
    last: int


def char_span_to_token_span(
    long_offsets: Sequence[Sequence[int]], long_source_ids: Sequence[int], span: TextSpan
) -> TokenSpan | None:
    """The long tokens covering `span`, or None when the window does not contain all of it."""
    overlapping = [
        i
        for i, ((start, end), source) in enumerate(zip(long_offsets, long_source_ids))
        if source == span.document and start < end and start < span.end and end > span.start
    ]
    if not overlapping:
        return None
    first, last = overlapping[0], overlapping[-1]
    # A window that cuts the answer holds only part of it: not a valid target there.
    if long_offsets[first][0] > span.start or long_offsets[last][1] < span.end:
        return None
    return TokenSpan(first, last)


def token_span_to_char_span(
    long_offsets: Sequence[Sequence[int]], long_source_ids: Sequence[int], tokens: TokenSpan
) -> TextSpan | None:
    """The characters from the start of token `first` to the end of token `last`; None across sources."""
    source = long_source_ids[tokens.first]
    if source < 0 or long_source_ids[tokens.last] != source or tokens.first > tokens.last:
        return None
    return TextSpan(source, long_offsets[tokens.first][0], long_offsets[tokens.last][1])
