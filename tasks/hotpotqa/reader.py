"""HotpotQA reader: the official JSON file (a list of examples) -> `StructuredExample`s.

Each context entry [title, sentences] becomes one document whose text is the title, a newline, and
the sentences joined with "" (they keep their leading spaces, so this rebuilds the paragraph); the
document has one paragraph with a title span and one span per sentence.

Gold answer spans (`answers`), for span answers (not "yes"/"no"): every exact, case-sensitive
occurrence of the answer string in the sentences that starts and ends at a word boundary (no
letter or digit just outside it), those in supporting-fact sentences first; if there is none, every
occurrence at all. Answers that occur nowhere in the sentences get no span.
`labels`: answer, supporting_facts ([title, sentence index] pairs), type, level.

The Hub's `hotpot_qa` (distractor and fullwiki) exports are read too (`longdoc.data.hub_exports`):
a row {id, question, answer, type, level, supporting_facts: {title, sent_id}, context: {title,
sentences}} is the official record with its pairs stored column-wise, and gives the same example.
"""

import os
import re
from typing import Iterator

from longdoc.data.examples import Document, Paragraph, Span, StructuredExample, TextSpan
from longdoc.data.hub_exports import example_records, records
from longdoc.data.records import RecordFields

HUB_COLUMNS = ("id", "question", "answer", "supporting_facts", "context")


def read_examples(path: str | os.PathLike) -> Iterator[StructuredExample]:
    for fields in example_records(path, "HotpotQA", "_id", HUB_COLUMNS, official_record):
        yield _example(fields)


def official_record(row: dict, where: str) -> dict:
    """The official record of a Hub `hotpot_qa` row."""
    facts = records(row["supporting_facts"], where, "supporting_facts")
    paragraphs = records(row["context"], where, "context")
    return {"_id": row["id"], "question": row["question"], "answer": row["answer"],
            "supporting_facts": [[fact.get("title"), fact.get("sent_id")] for fact in facts],
            "context": [[paragraph.get("title"), paragraph.get("sentences")] for paragraph in paragraphs],
            **{name: row[name] for name in ("type", "level") if name in row}}


def _example(fields: RecordFields) -> StructuredExample:
    documents = []
    for number, entry in enumerate(fields.get("context", list)):
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
            raise fields.error("context", f"entry {number} must be [title, [sentence, ...]]")
        title, sentences = entry[0], fields.string_list(f"context[{number}][1]", entry[1])
        text, spans = title + "\n", []
        for sentence in sentences:
            spans.append(Span(len(text), len(text) + len(sentence)))
            text += sentence
        documents.append(Document(text, [Paragraph(Span(0, len(text)), spans, title=Span(0, len(title)))]))
    supporting = fields.get("supporting_facts", list)
    if not all(isinstance(f, list) and len(f) == 2 and isinstance(f[0], str) and isinstance(f[1], int)
               for f in supporting):
        raise fields.error("supporting_facts", "must be a list of [title, sentence index] pairs")
    answer = fields.get("answer", str)
    example = StructuredExample(
        id=fields.example_id,
        question=fields.get("question", str),
        documents=documents,
        labels={"answer": answer, "supporting_facts": supporting,
                "type": fields.get("type", str, None), "level": fields.get("level", str, None)},
    )
    if answer not in ("yes", "no"):
        example.answers = answer_spans(example, answer, {(title, sid) for title, sid in supporting})
    return example.validate()


def answer_spans(example: StructuredExample, answer: str, supporting: set[tuple[str, int]]) -> list[TextSpan]:
    """Occurrences of `answer` in the sentences, by the rule in the module docstring."""
    if not answer:
        return []
    pattern = re.compile(re.escape(answer))
    preferred, others = [], []
    for d, document in enumerate(example.documents):
        paragraph = document.paragraphs[0]
        title = document.text[paragraph.title.start:paragraph.title.end]
        for s, sentence in enumerate(paragraph.sentences):
            found = [TextSpan(d, m.start(), m.end()) for m in pattern.finditer(document.text, sentence.start, sentence.end)]
            (preferred if (title, s) in supporting else others).extend(found)
    found = preferred + others
    bounded = [span for span in found if _at_word_boundaries(example.documents[span.document].text, span)]
    return bounded or found


def _at_word_boundaries(text: str, span: TextSpan) -> bool:
    before = text[span.start - 1] if span.start > 0 else " "
    after = text[span.end] if span.end < len(text) else " "
    return not before.isalnum() and not after.isalnum()
