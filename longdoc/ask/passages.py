"""A document's text -> passages: the windows that are embedded, retrieved and read.

Passages follow the text's own structure (`longdoc.data.text`: paragraphs at blank lines, then
sentences): a paragraph is one passage when it fits `max_tokens` wordpieces, else runs of whole
consecutive sentences that fit; a short paragraph (under `min_tokens`, such as a heading) is
joined to the start of the next one. A single sentence longer than `max_tokens` is cut
at spaces into pieces of `max_tokens // 2` words (a word is one or more wordpieces, so each piece
usually fits; the embedder truncates what does not). Every offset is a character offset into the
text, and each passage keeps its sentences' spans for the reader's supporting facts.

The defaults suit all-MiniLM-L6-v2, which was trained on inputs of at most 128 wordpieces
(sentence-transformers model card).
"""

from dataclasses import dataclass
from typing import Callable, Sequence

from longdoc.data.text import split_paragraphs, split_sentences

MAX_TOKENS = 128
MIN_TOKENS = 24
PASSAGE_FORMAT = 1  # bump when the rules above change: cached indexes are keyed by it


@dataclass(frozen=True)
class Passage:
    start: int
    end: int
    sentences: tuple[tuple[int, int], ...]  # character spans, inside [start, end)


def _word_pieces(text: str, start: int, end: int, words_per_piece: int) -> list[tuple[int, int]]:
    spans, piece_start, count, position = [], None, 0, start
    for word in text[start:end].split():
        word_start = text.index(word, position, end)
        position = word_start + len(word)
        if piece_start is None:
            piece_start = word_start
        count += 1
        if count == words_per_piece:
            spans.append((piece_start, position))
            piece_start, count = None, 0
    if piece_start is not None:
        spans.append((piece_start, position))
    return spans


def split_passages(text: str, count_tokens: Callable[[Sequence[str]], list[int]], max_tokens: int = MAX_TOKENS,
                   min_tokens: int = MIN_TOKENS) -> list[Passage]:
    """The passages of `text` by the rules of the module docstring, in text order."""
    paragraphs = []  # per paragraph: its sentence spans
    for start, end in split_paragraphs(text):
        paragraphs.append(split_sentences(text, start, end))
    counts = iter(count_tokens([text[s:e] for sentences in paragraphs for s, e in sentences]))
    groups: list[list[tuple[int, int, int]]] = []  # per paragraph: [(start, end, tokens), ...]
    for sentences in paragraphs:
        units = []
        for (start, end), tokens in zip(sentences, counts):
            if tokens <= max_tokens:
                units.append((start, end, tokens))
            else:
                pieces = _word_pieces(text, start, end, max(1, max_tokens // 2))
                units.extend((s, e, min(max_tokens, count)) for (s, e), count in zip(pieces, count_tokens(
                    [text[s:e] for s, e in pieces])))
        groups.append(units)

    passages: list[list[tuple[int, int, int]]] = []
    carried: list[tuple[int, int, int]] = []  # a short paragraph waiting to join the next
    for units in groups:
        units, carried = carried + units, []
        current: list[tuple[int, int, int]] = []
        for unit in units:
            if current and sum(u[2] for u in current) + unit[2] > max_tokens:
                passages.append(current)
                current = []
            current.append(unit)
        if sum(u[2] for u in current) < min_tokens:
            carried = current
        else:
            passages.append(current)
    if carried:
        passages.append(carried)
    return [Passage(units[0][0], units[-1][1], tuple((s, e) for s, e, _ in units)) for units in passages]
