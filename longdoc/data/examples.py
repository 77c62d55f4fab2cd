"""Structured examples: the one input format every task reader produces and `build_features` reads.

An example is a question plus documents. Each document is one source string; everything else
(paragraphs, titles, sentences, candidate mentions, DOM nodes, answers) is a character span into
one of those strings, so that any model output can be mapped back to exact text (the ETC paper's
HotpotQA, WikiHop, NQ and OpenKP constructions all start from such structure; ETC, Ainslie et al.
2020, section 3).

`StructuredExample.validate()` checks every field and span and raises `InputError` naming the
example id and the field, so a bad record fails before any tokenisation.
"""

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from longdoc.errors import InputError
from longdoc.data.text import split_paragraphs, split_sentences
from longdoc.io import replace_lone_surrogates


@dataclass(frozen=True)
class Span:
    """Characters [start, end) of one document's text."""

    start: int
    end: int


@dataclass(frozen=True)
class TextSpan:
    """Characters [start, end) of document `document` (an index into `StructuredExample.documents`)."""

    document: int
    start: int
    end: int


@dataclass
class Paragraph:
    """A paragraph of a document: an optional title and its sentences, all spans into the document.

    `span` covers the whole paragraph (title included); its long tokens that fall in no sentence
    (the title, gaps between sentences) belong to the paragraph's own global token.
    """

    span: Span
    sentences: list[Span] = field(default_factory=list)
    title: Span | None = None


@dataclass
class Document:
    """One source string and its paragraphs (which may leave gaps, e.g. NQ's HTML between candidates)."""

    text: str
    paragraphs: list[Paragraph] = field(default_factory=list)

    @classmethod
    def from_text(cls, text: str) -> "Document":
        """Plain text split by the rules of `longdoc.data.text`: paragraphs on blank lines, then sentences."""
        paragraphs = [
            Paragraph(span=Span(start, end), sentences=[Span(*s) for s in split_sentences(text, start, end)])
            for start, end in split_paragraphs(text)
        ]
        return cls(text=text, paragraphs=paragraphs)


@dataclass
class Candidate:
    """An answer candidate (WikiHop) and where it is mentioned in the documents."""

    text: str
    mentions: list[TextSpan] = field(default_factory=list)


@dataclass
class DomNode:
    """A visual DOM node (OpenKP): the text it renders and its visual feature vector."""

    span: TextSpan
    features: list[float]


@dataclass
class StructuredExample:
    """A question over documents, with optional candidates, DOM nodes, gold answer spans and labels.

    `labels` holds task-specific gold data the feature builder does not read (supporting facts, NQ
    annotations, keyphrases); it must be JSON-serialisable so that examples can be cached.
    """

    id: str
    question: str
    documents: list[Document]
    candidates: list[Candidate] = field(default_factory=list)
    dom_nodes: list[DomNode] = field(default_factory=list)
    answers: list[TextSpan] = field(default_factory=list)
    labels: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> "StructuredExample":
        """Check types and spans; clean unencodable text. Returns self, or raises `InputError`."""
        if not isinstance(self.id, str) or not self.id:
            raise InputError(f"example id must be a non-empty string, got {self.id!r}")
        self.question = self._text(self.question, "question")
        if not isinstance(self.documents, list):
            raise InputError(self._where("documents", "must be a list"))
        for d, document in enumerate(self.documents):
            name = f"documents[{d}]"
            if not isinstance(document, Document):
                raise InputError(self._where(name, f"must be a Document, got {type(document).__name__}"))
            document.text = self._text(document.text, f"{name}.text")
            for p, paragraph in enumerate(document.paragraphs):
                pname = f"{name}.paragraphs[{p}]"
                self._span(paragraph.span, len(document.text), f"{pname}.span")
                if paragraph.title is not None:
                    self._span(paragraph.title, len(document.text), f"{pname}.title", within=paragraph.span)
                for s, sentence in enumerate(paragraph.sentences):
                    self._span(sentence, len(document.text), f"{pname}.sentences[{s}]", within=paragraph.span)
        for c, candidate in enumerate(self.candidates):
            if not isinstance(candidate.text, str):
                raise InputError(self._where(f"candidates[{c}].text", "must be a string"))
            for m, mention in enumerate(candidate.mentions):
                self._text_span(mention, f"candidates[{c}].mentions[{m}]")
        for n, node in enumerate(self.dom_nodes):
            self._text_span(node.span, f"dom_nodes[{n}].span")
            if not isinstance(node.features, list) or not all(
                isinstance(value, (int, float)) and not isinstance(value, bool) for value in node.features
            ):
                raise InputError(self._where(f"dom_nodes[{n}].features", "must be a list of numbers"))
        for a, answer in enumerate(self.answers):
            self._text_span(answer, f"answers[{a}]")
        return self

    def paragraph_locations(self) -> list[tuple[int, int]]:
        """(document, paragraph) of every paragraph, in the flat order feature ids use."""
        return [(d, p) for d, document in enumerate(self.documents) for p in range(len(document.paragraphs))]

    def sentence_locations(self) -> list[tuple[int, int, int]]:
        """(document, paragraph, sentence) of every sentence, in the flat order feature ids use."""
        return [
            (d, p, s)
            for d, document in enumerate(self.documents)
            for p, paragraph in enumerate(document.paragraphs)
            for s in range(len(paragraph.sentences))
        ]

    def text_of(self, span: TextSpan) -> str:
        return self.documents[span.document].text[span.start:span.end]

    def _where(self, name: str, problem: str) -> str:
        return f"example {self.id!r}: field {name!r} {problem}"

    def _text(self, value: Any, name: str) -> str:
        if not isinstance(value, str):
            raise InputError(self._where(name, f"must be a string, got {type(value).__name__}"))
        return replace_lone_surrogates(value, f"example {self.id!r} field {name!r}")

    def _span(self, span: Any, length: int, name: str, within: Span | None = None) -> None:
        if not isinstance(span, Span) or not all(isinstance(v, int) for v in (span.start, span.end)):
            raise InputError(self._where(name, f"must be a Span of integers, got {span!r}"))
        low, high = (0, length) if within is None else (within.start, within.end)
        if not low <= span.start <= span.end <= high:
            raise InputError(self._where(name, f"span [{span.start}, {span.end}) is outside [{low}, {high})"))

    def _text_span(self, span: Any, name: str) -> None:
        if not isinstance(span, TextSpan) or not isinstance(span.document, int):
            raise InputError(self._where(name, f"must be a TextSpan, got {span!r}"))
        if not 0 <= span.document < len(self.documents):
            raise InputError(self._where(name, f"names document {span.document}, but there are {len(self.documents)}"))
        self._span(Span(span.start, span.end), len(self.documents[span.document].text), name)


def example_to_json(example: StructuredExample) -> str:
    """One JSON string per example, so that `datasets` can cache examples of any shape in one column."""
    return json.dumps(asdict(example), ensure_ascii=False)


def example_from_json(text: str) -> StructuredExample:
    """The inverse of `example_to_json`."""
    record = json.loads(text)
    documents = [
        Document(
            text=document["text"],
            paragraphs=[
                Paragraph(
                    span=Span(**paragraph["span"]),
                    sentences=[Span(**sentence) for sentence in paragraph["sentences"]],
                    title=None if paragraph["title"] is None else Span(**paragraph["title"]),
                )
                for paragraph in document["paragraphs"]
            ],
        )
        for document in record["documents"]
    ]
    return StructuredExample(
        id=record["id"],
        question=record["question"],
        documents=documents,
        candidates=[
            Candidate(text=c["text"], mentions=[TextSpan(**m) for m in c["mentions"]]) for c in record["candidates"]
        ],
        dom_nodes=[DomNode(span=TextSpan(**n["span"]), features=n["features"]) for n in record["dom_nodes"]],
        answers=[TextSpan(**a) for a in record["answers"]],
        labels=record["labels"],
    )
