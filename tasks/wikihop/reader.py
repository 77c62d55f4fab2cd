"""WikiHop (QAngaroo v1.1) reader: the official JSON file (a list of examples) -> `StructuredExample`s.

The question is the query as given ("relation subject", e.g. "country sms braunschweig"). Each
support is one document, split into paragraphs and sentences by `longdoc.data.text`'s plain-text rules.
Candidate mentions (the rule, as in ETC's WikiHop construction, which links mention tokens to
candidate globals): every case-insensitive occurrence of the candidate string in a support that is
not preceded or followed by a word character (letter, digit or underscore), so "italy" is found in
"Italy," but not in "Italya". Overlapping mentions of different candidates are all kept; the
feature builder gives shared tokens to the longest one.
`labels`: answer, answer_index (into candidates), annotations (dev only, else absent).

The Hub's `wiki_hop` exports are read too (`longdoc.data.hub_exports`): a row {id, question,
answer, candidates, supports, annotations} is the official record with "query" named "question".
"""

import os
import re
from typing import Iterator

from longdoc.data.examples import Candidate, Document, StructuredExample, TextSpan
from longdoc.data.hub_exports import example_records
from longdoc.data.records import RecordFields

HUB_COLUMNS = ("id", "question", "answer", "candidates", "supports")


def read_examples(path: str | os.PathLike) -> Iterator[StructuredExample]:
    for fields in example_records(path, "WikiHop", "id", HUB_COLUMNS, official_record):
        yield _example(fields)


def official_record(row: dict, where: str) -> dict:
    """The official record of a Hub `wiki_hop` row."""
    record = {"id": row["id"], "query": row["question"], "answer": row["answer"],
              "candidates": row["candidates"], "supports": row["supports"]}
    if row.get("annotations"):  # the Hub stores train's missing annotations as an empty list
        record["annotations"] = row["annotations"]
    return record


def _example(fields: RecordFields) -> StructuredExample:
    supports = fields.string_list("supports")
    candidates = fields.string_list("candidates")
    answer = fields.get("answer", str)
    if answer not in candidates:
        raise fields.error("answer", f"{answer!r} is not one of the candidates")
    documents = [Document.from_text(support) for support in supports]
    labels = {"answer": answer, "answer_index": candidates.index(answer)}
    if "annotations" in fields.record:
        labels["annotations"] = fields.get("annotations", list)
    return StructuredExample(
        id=fields.example_id,
        question=fields.get("query", str),
        documents=documents,
        candidates=[Candidate(text, find_mentions(text, documents)) for text in candidates],
        labels=labels,
    ).validate()


def find_mentions(candidate: str, documents: list[Document]) -> list[TextSpan]:
    """Occurrences of `candidate` in the documents by the rule in the module docstring."""
    if not candidate.strip():
        return []
    pattern = re.compile(r"(?<!\w)" + re.escape(candidate) + r"(?!\w)", re.IGNORECASE)
    return [TextSpan(d, m.start(), m.end()) for d, document in enumerate(documents)
            for m in pattern.finditer(document.text)]
