"""Plain text: splitting text into paragraphs and sentences, and the character spans of
pre-tokenized text (tokens joined by single spaces, as NQ's simplified `document_text` and OpenKP's
`text` are). Offsets are into the decoded text (longdoc.io.decode_text).

Splitting rules (nothing is downloaded; NLTK's punkt would need a model download):
- Paragraphs are separated by blank lines: a line break, optional spaces/tabs, another line break.
- A sentence ends at a run of `.`, `!` or `?` (plus any closing quotes or brackets) that is followed
  by whitespace and then an uppercase letter, a digit or an opening quote/bracket, unless the word
  before the period is a known abbreviation (Mr., Dr., e.g., ...) or a single letter (an initial,
  as in "J. R. R. Tolkien"). The rest of a paragraph after its last boundary is its last sentence.
Spans never include the whitespace around a paragraph or sentence.
"""

import re

_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt vs etc e.g i.e cf al no vol fig inc ltd co corp dept gen col lt sgt "
    "capt rev gov sen rep jan feb mar apr jun jul aug sep sept oct nov dec approx est u.s u.k".split()
)
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n\s*")
# terminator run, closing quotes/brackets, whitespace, then what may start a sentence
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s+[\"'“‘(\[]?[A-Z0-9À-Þ])")
_WORD_BEFORE = re.compile(r"(\S+)$")


def token_char_spans(text: str) -> list[tuple[int, int]]:
    """Character [start, end) of every token of `text`, a pre-tokenized text whose tokens are
    separated by single spaces (token i is `text.split(" ")[i]`, empty tokens included)."""
    spans, start = [], 0
    for token in text.split(" "):
        spans.append((start, start + len(token)))
        start += len(token) + 1
    return spans


def split_paragraphs(text: str) -> list[tuple[int, int]]:
    """Character spans [start, end) of the paragraphs of `text` (separated by blank lines)."""
    spans, start = [], 0
    for gap in [*_PARAGRAPH_BREAK.finditer(text), None]:
        end = len(text) if gap is None else gap.start()
        span = _strip(text, start, end)
        if span is not None:
            spans.append(span)
        if gap is not None:
            start = gap.end()
    return spans


def split_sentences(text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """Character spans of the sentences of text[start:end] (offsets into `text`)."""
    end = len(text) if end is None else end
    spans, sentence_start = [], start
    for match in _SENTENCE_END.finditer(text, start, end):
        if _is_abbreviation(text[sentence_start:match.start() + 1]):
            continue
        span = _strip(text, sentence_start, match.end())
        if span is not None:
            spans.append(span)
        sentence_start = match.end()
    span = _strip(text, sentence_start, end)
    if span is not None:
        spans.append(span)
    return spans


def _is_abbreviation(text_through_period: str) -> bool:
    if not text_through_period.endswith("."):
        return False
    word = _WORD_BEFORE.search(text_through_period[:-1])
    if word is None:
        return False
    token = word.group(1).lstrip("\"'“‘([").lower()
    return token in _ABBREVIATIONS or (len(token) == 1 and token.isalpha())


def _strip(text: str, start: int, end: int) -> tuple[int, int] | None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None

