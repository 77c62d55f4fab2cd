"""Reading Natural Questions gold annotations, original or simplified format.

Both formats are JSON lines (plain or .gz), one example per line, each with `example_id` and
`annotations`: per annotator a `long_answer` span, a list of `short_answers` spans and a
`yes_no_answer` ("YES", "NO", "NONE").
- original format (nq-dev-*.jsonl.gz, what the official nq_eval.py reads): spans carry byte and
  token offsets; `document_tokens` lists {token, start_byte, end_byte, html_token}.
- simplified format (simplified-nq-*.jsonl, made by the official text_utils.simplify_nq_example):
  spans carry token offsets only; `document_text` is the tokens joined by single spaces (split
  with `split(" ")`), HTML tags included as tokens such as `<P>` or `<Td_colspan="2">`.

The official reader takes a glob for sharded gold (nq-dev-0[0-4].jsonl.gz); so does this one.
Only annotations matter to the official metric; the document tokens are read for the ROUGE-L
figures, which need answer text.
"""

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from longdoc.errors import InputError
from longdoc.io import iter_jsonl
from longdoc.tasks.nq.spans import AnswerLabel, Span, parse_span, parse_yes_no

# HTML tags that simplify_nq_example kept as tokens (blanks inside replaced by "_"). A lone "<"
# is ordinary text in the documents, so a tag needs a name.
_HTML_TAG = re.compile(r"</?[A-Za-z][^<>]*>")


@dataclass(frozen=True)
class Document:
    """The document's tokens, which of them are HTML, and (original format only) byte offsets."""

    tokens: tuple[str, ...]
    is_html: tuple[bool, ...]
    byte_offsets: tuple[tuple[int, int], ...] | None

    def token_indices(self, span: Span) -> Sequence[int]:
        """The tokens a span covers: by its token offsets first, else by its byte offsets."""
        if span.has_tokens:
            return _token_range(span.start_token, span.end_token, len(self.tokens))
        if span.has_bytes and self.byte_offsets is not None:
            return [
                i
                for i, (start, end) in enumerate(self.byte_offsets)
                if start >= span.start_byte and end <= span.end_byte
            ]
        return []

    def text(self, span: Span) -> str:
        """The span's non-HTML tokens joined by spaces."""
        return " ".join(self.tokens[i] for i in self.token_indices(span) if not self.is_html[i])


def _token_range(start: float, end: float, length: int) -> range:
    # Offsets are any JSON number (the official script compares them by value); only whole
    # numbers name tokens.
    if not (float(start).is_integer() and float(end).is_integer()):
        return range(0)
    return range(int(start), min(int(end), length))


@dataclass(frozen=True)
class GoldExample:
    example_id: Any
    annotations: tuple[AnswerLabel, ...]
    document: Document | None
    where: str  # "file:line", for messages
    question_text: str = ""  # (the metric ignores it; the browser shows it)


def _read_document(record: dict, where: str) -> Document | None:
    if "document_tokens" in record:
        try:
            tokens = record["document_tokens"]
            return Document(
                tokens=tuple(str(t["token"]) for t in tokens),
                is_html=tuple(bool(t["html_token"]) for t in tokens),
                byte_offsets=tuple((t["start_byte"], t["end_byte"]) for t in tokens),
            )
        except (TypeError, KeyError) as error:
            raise InputError(
                f"{where}: 'document_tokens' must be a list of {{token, start_byte, end_byte, html_token}} ({error!r})"
            ) from None
    if "document_text" in record:
        if not isinstance(record["document_text"], str):
            raise InputError(f"{where}: 'document_text' must be a string")
        tokens = tuple(record["document_text"].split(" "))
        return Document(tokens, tuple(bool(_HTML_TAG.fullmatch(t)) for t in tokens), None)
    return None


def _read_annotation(annotation: Any, where: str) -> AnswerLabel:
    if not isinstance(annotation, dict):
        raise InputError(f"{where}: each annotation must be a JSON object")
    for field in ("long_answer", "short_answers", "yes_no_answer"):
        if field not in annotation:
            raise InputError(f"{where}: annotation without field {field!r}")
    if not isinstance(annotation["short_answers"], list):
        raise InputError(f"{where}: 'short_answers' must be a list")
    return AnswerLabel(
        long_span=parse_span(annotation["long_answer"], lambda: f"{where}: long_answer"),
        short_spans=tuple(parse_span(s, lambda: f"{where}: short_answers") for s in annotation["short_answers"]),
        yes_no=parse_yes_no(annotation["yes_no_answer"], lambda: where),
    )


def _read_example(record: Any, where: str) -> GoldExample:
    if not isinstance(record, dict):
        raise InputError(f"{where}: each line must be a JSON object (an NQ example)")
    for field in ("example_id", "annotations"):
        if field not in record:
            raise InputError(f"{where}: missing field {field!r}")
    if isinstance(record["example_id"], (list, dict)):
        raise InputError(f"{where}: 'example_id' must be a number or a string")
    if not isinstance(record["annotations"], list):
        raise InputError(f"{where}: 'annotations' must be a list")
    return GoldExample(
        example_id=record["example_id"],
        annotations=tuple(_read_annotation(a, where) for a in record["annotations"]),
        document=_read_document(record, where),
        where=where,
        question_text=str(record.get("question_text", "")),
    )


def gold_paths(pattern: str | os.PathLike) -> list[Path]:
    """The gold file, or the shards a glob pattern names (as the official --gold_path)."""
    if Path(pattern).exists():
        return [Path(pattern)]
    paths = sorted(Path(p) for p in glob.glob(str(pattern)))
    if not paths:
        raise FileNotFoundError(f"no NQ gold file matches {pattern}")
    return paths


def iter_gold(pattern: str | os.PathLike) -> Iterator[GoldExample]:
    """Stream gold examples from a file or glob, one at a time (dev gold with HTML is ~1 GB)."""
    for path in gold_paths(pattern):
        for line_number, record in iter_jsonl(path):
            yield _read_example(record, f"{path}:{line_number}")
