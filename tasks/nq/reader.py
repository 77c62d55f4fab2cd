"""Natural Questions reader (simplified format, JSON lines) -> `StructuredExample`s.

The document is `document_text` itself: tokens (HTML tags such as "<P>" included) are
`document_text.split(" ")`, so token i spans characters [starts[i], starts[i] + len(token)).
Each top-level long-answer candidate becomes a paragraph (ETC's NQ construction has one global
token per long-answer candidate); nested candidates stay in the labels. Tokens outside every
top-level candidate belong to no paragraph.
`answers`: the character spans of every annotator's short answers.
`labels`: document_url, annotations and long_answer_candidates exactly as in the file (token
offsets; `token_char_spans` maps them to characters).
"""

import os
from typing import Iterator

from longdoc.data.examples import Document, Paragraph, Span, StructuredExample, TextSpan
from longdoc.io import iter_jsonl
from longdoc.data.records import RecordFields
from longdoc.data.text import token_char_spans


def read_examples(path: str | os.PathLike) -> Iterator[StructuredExample]:
    for line, record in iter_jsonl(path):
        yield _example(RecordFields(record, f"{path}:{line}", "example_id", line))


def _example(fields: RecordFields) -> StructuredExample:
    text = fields.get("document_text", str)
    tokens = token_char_spans(text)
    candidates = fields.get("long_answer_candidates", list)
    paragraphs = []
    for number, candidate in enumerate(candidates):
        start, end = _token_range(fields, f"long_answer_candidates[{number}]", candidate, len(tokens))
        if candidate.get("top_level", True) and end > start:
            paragraphs.append(Paragraph(Span(tokens[start][0], tokens[end - 1][1])))
    annotations = fields.get("annotations", list, [])
    answers = []
    for number, annotation in enumerate(annotations):
        if not isinstance(annotation, dict) or not isinstance(annotation.get("short_answers", []), list):
            raise fields.error(f"annotations[{number}]", "must be an object with a short_answers list")
        for k, short in enumerate(annotation.get("short_answers", [])):
            start, end = _token_range(fields, f"annotations[{number}].short_answers[{k}]", short, len(tokens))
            if end > start:
                answers.append(TextSpan(0, tokens[start][0], tokens[end - 1][1]))
    return StructuredExample(
        id=fields.example_id,
        question=fields.get("question_text", str),
        documents=[Document(text, paragraphs)],
        answers=answers,
        labels={"document_url": fields.get("document_url", str, None), "annotations": annotations,
                "long_answer_candidates": candidates},
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
