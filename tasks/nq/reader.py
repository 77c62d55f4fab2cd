"""Natural Questions reader, simplified and original formats -> `StructuredExample`s, streaming.

Both formats are JSON lines (plain or .gz), one example per line; the format is told per line:
- simplified (simplified-nq-*.jsonl, made by the official text_utils.simplify_nq_example): the
  document is `document_text`, whose tokens (HTML tags such as "<P>" included) are
  `document_text.split(" ")`; spans carry token offsets only.
- original (nq-*.jsonl.gz): `document_tokens` lists {token, start_byte, end_byte, html_token};
  the document text is built the way simplify_nq_example builds `document_text` (tokens joined by
  single spaces, blanks inside a token replaced by "_"), so token i is `text.split(" ")[i]` in
  both formats; the tokens' byte offsets are kept so that predictions can carry them too.
So token i spans characters [starts[i], starts[i] + len(token)) of the document text.

Each top-level long-answer candidate becomes a paragraph (ETC's NQ construction has one global
token per long-answer candidate); nested candidates stay in the labels. Tokens outside every
top-level candidate belong to no paragraph. HTML tag tokens stay in the text as they are: the
feature builder's tokenizer turns each into one marker wordpiece (`longdoc.tasks.nq.features`).
`answers`: the character spans of every annotator's short answers.
`labels`: `example_id` as in the file (an integer in NQ: the prediction file must repeat it),
document_url, annotations and long_answer_candidates exactly as in the file (token offsets;
`token_char_spans` maps them to characters), `top_level_candidates` (the candidate index of each
paragraph) and, in the original format only, `token_bytes` ([start_byte, end_byte] per token).

The Hub's `natural_questions` exports are read too (`longdoc.data.hub_exports`): a row {id,
document: {title, url, html, tokens: {token, is_html, start_byte, end_byte}}, question: {text,
tokens}, long_answer_candidates, annotations: {id, long_answer, short_answers, yes_no_answer (-1
none, 0 no, 1 yes)}} is the original format with its sequences stored column-wise, and gives the
same example; its string id becomes the official integer example_id.

Streaming: lines are read and parsed one at a time, so memory follows the longest line, never
the file (the training set is 40+ GB). A line that is not valid JSON, or whose record is wrong
(a missing field, a span outside the document), stops the run with the file, line and field;
with `skip_bad_lines=True` it is skipped instead, counted, and one warning at the end of the file
gives the count and the first lines skipped.
"""

import gzip
import json
import os
import warnings
from pathlib import Path
from typing import Any, Iterator

from longdoc.data.examples import Document, Paragraph, Span, StructuredExample, TextSpan
from longdoc.data.hub_exports import export_kind, hub_rows, records
from longdoc.data.records import RecordFields
from longdoc.data.text import token_char_spans
from longdoc.errors import InputError, OptionWarning
from longdoc.io import decode_text

# Skipped lines named in the closing warning; the count covers all of them.
SHOWN_SKIPPED_LINES = 5
HUB_COLUMNS = ("id", "document", "question", "long_answer_candidates", "annotations")
YES_NO = {-1: "NONE", 0: "NO", 1: "YES"}  # the Hub's class ids of yes_no_answer


def read_examples(path: str | os.PathLike, skip_bad_lines: bool = False,
                  skipped: list[str] | None = None) -> Iterator[StructuredExample]:
    """Examples of the NQ file `path`, one line at a time. With `skip_bad_lines`, bad lines are
    skipped; each one's message ("file:line: problem") is appended to `skipped` when given."""
    path = Path(path)
    bad: list[str] = []
    for where, index, raw in _raw_records(path):
        try:
            example = _example(RecordFields(_official(raw, where), where, "example_id", index))
        except InputError as error:
            if not skip_bad_lines:
                raise
            bad.append(str(error))
            if skipped is not None:
                skipped.append(str(error))
            continue
        yield example
    if bad:
        shown = "; ".join(bad[:SHOWN_SKIPPED_LINES]) + (" ..." if len(bad) > SHOWN_SKIPPED_LINES else "")
        warnings.warn(OptionWarning("{path}: skipped {count} bad line(s) ({skip_bad_lines}): {shown}", path=path,
                                    count=len(bad), shown=shown), stacklevel=2)


def _raw_records(path: Path) -> Iterator[tuple[str, int, bytes | dict]]:
    """(where, index, line or row) per example: JSON lines, or the rows of a `datasets` folder or
    parquet file of the Hub's schema."""
    if export_kind(path) in ("folder", "parquet"):
        yield from hub_rows(path, "Natural Questions", HUB_COLUMNS)
        return
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        for line_number, line in enumerate(handle, start=1):
            if line.strip():
                yield f"{path}:{line_number}", line_number, line


def _official(raw: bytes | dict, where: str) -> Any:
    """The official record of a line (either official format, or the Hub's schema) or of a row."""
    record = _parse(raw, where) if isinstance(raw, bytes) else raw
    if isinstance(record, dict) and isinstance(record.get("document"), dict):
        return official_record(record, where)
    return record


def official_record(row: dict, where: str) -> dict:
    """The original-format record of a Hub `natural_questions` row."""
    missing = [name for name in HUB_COLUMNS if name not in row]
    if missing:
        raise InputError(f"{where}: a Hub natural_questions row needs the columns {list(HUB_COLUMNS)}; missing "
                         f"{missing} (exports made before the Hub added long_answer_candidates cannot be read)")
    document, question = row["document"], row["question"]
    tokens = records(document.get("tokens"), where, "document.tokens")
    example_id = row["id"]
    if isinstance(example_id, str) and example_id.lstrip("-").isdigit():
        example_id = int(example_id)
    return {
        "example_id": example_id,
        "question_text": question.get("text") if isinstance(question, dict) else question,
        "document_title": document.get("title"),
        "document_url": document.get("url"),
        "document_tokens": [{"token": token.get("token"), "start_byte": token.get("start_byte"),
                             "end_byte": token.get("end_byte"), "html_token": token.get("is_html")}
                            for token in tokens],
        "long_answer_candidates": records(row["long_answer_candidates"], where, "long_answer_candidates"),
        "annotations": [{"annotation_id": annotation.get("id"), "long_answer": annotation.get("long_answer"),
                         "short_answers": records(annotation.get("short_answers"), where, "annotations.short_answers"),
                         "yes_no_answer": YES_NO.get(annotation.get("yes_no_answer"), annotation.get("yes_no_answer"))}
                        for annotation in records(row["annotations"], where, "annotations")],
    }


def _parse(line: bytes, where: str) -> Any:
    try:
        return json.loads(decode_text(line, where))
    except json.JSONDecodeError as error:
        raise InputError(f"{where}:{error.colno}: not valid JSON: {error.msg}") from None


def _document(fields: RecordFields) -> tuple[str, list[list[int]] | None]:
    """The document text and, in the original format, each token's [start_byte, end_byte]."""
    if "document_tokens" not in fields.record:
        return fields.get("document_text", str), None
    tokens, offsets = [], []
    for number, token in enumerate(fields.get("document_tokens", list)):
        name = f"document_tokens[{number}]"
        if not isinstance(token, dict) or not isinstance(token.get("token"), str):
            raise fields.error(name, "must be an object with a string 'token'")
        start, end = token.get("start_byte"), token.get("end_byte")
        if not isinstance(start, int) or not isinstance(end, int) or isinstance(start, bool) or not 0 <= start <= end:
            raise fields.error(name, "needs integer start_byte <= end_byte")
        # As simplify_nq_example: a token never holds the separator.
        tokens.append(token["token"].replace(" ", "_"))
        offsets.append([start, end])
    return " ".join(tokens), offsets


def _example(fields: RecordFields) -> StructuredExample:
    text, token_bytes = _document(fields)
    tokens = token_char_spans(text)
    candidates = fields.get("long_answer_candidates", list)
    paragraphs, top_level = [], []
    for number, candidate in enumerate(candidates):
        start, end = _token_range(fields, f"long_answer_candidates[{number}]", candidate, len(tokens))
        if candidate.get("top_level", True) and end > start:
            paragraphs.append(Paragraph(Span(tokens[start][0], tokens[end - 1][1])))
            top_level.append(number)
    annotations = fields.get("annotations", list, [])
    answers = []
    for number, annotation in enumerate(annotations):
        if not isinstance(annotation, dict) or not isinstance(annotation.get("short_answers", []), list):
            raise fields.error(f"annotations[{number}]", "must be an object with a short_answers list")
        long_answer = annotation.get("long_answer")
        if isinstance(long_answer, dict) and long_answer.get("start_token", -1) != -1:
            _token_range(fields, f"annotations[{number}].long_answer", long_answer, len(tokens))
        for k, short in enumerate(annotation.get("short_answers", [])):
            start, end = _token_range(fields, f"annotations[{number}].short_answers[{k}]", short, len(tokens))
            if end > start:
                answers.append(TextSpan(0, tokens[start][0], tokens[end - 1][1]))
    labels = {"example_id": fields.record["example_id"], "document_url": fields.get("document_url", str, None),
              "annotations": annotations, "long_answer_candidates": candidates, "top_level_candidates": top_level}
    if token_bytes is not None:
        labels["token_bytes"] = token_bytes
    return StructuredExample(
        id=fields.example_id,
        question=fields.get("question_text", str),
        documents=[Document(text, paragraphs)],
        answers=answers,
        labels=labels,
    ).validate()


def _token_range(fields: RecordFields, name: str, record: object, num_tokens: int) -> tuple[int, int]:
    if not isinstance(record, dict):
        raise fields.error(name, "must be an object with start_token and end_token")
    start, end = record.get("start_token"), record.get("end_token")
    if not isinstance(start, int) or not isinstance(end, int):
        raise fields.error(name, "needs integer start_token and end_token")
    if not 0 <= start <= end <= num_tokens:
        raise fields.error(name, f"token range [{start}, {end}) is outside the document's {num_tokens} tokens")
    return start, end
