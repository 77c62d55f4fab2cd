"""Structured examples: validation errors name the example and field; JSON round trip; plain text."""

import pytest

from longdoc.errors import InputError
from longdoc.data.examples import (
    Candidate, Document, DomNode, Paragraph, Span, StructuredExample, TextSpan, example_from_json, example_to_json,
)


def example(**changes):
    fields = dict(
        id="e1", question="q?", documents=[Document("Ab cd. Ef.", [Paragraph(Span(0, 10), [Span(0, 6), Span(7, 10)])])],
        candidates=[Candidate("ab", [TextSpan(0, 0, 2)])], dom_nodes=[DomNode(TextSpan(0, 7, 9), [1.0])],
        answers=[TextSpan(0, 3, 5)], labels={"answer": "cd"},
    )
    fields.update(changes)
    return StructuredExample(**fields)


@pytest.mark.parametrize(
    "changes,field,problem",
    [
        (dict(question=None), "question", "must be a string, got NoneType"),
        (dict(documents=[Document(b"bytes")]), "documents[0].text", "must be a string"),
        (dict(documents=[Document("abc", [Paragraph(Span(0, 9))])]), "documents[0].paragraphs[0].span", "outside [0, 3)"),
        (dict(documents=[Document("abc", [Paragraph(Span(0, 2), [Span(1, 3)])])]),
         "documents[0].paragraphs[0].sentences[0]", "outside [0, 2)"),
        (dict(answers=[TextSpan(3, 0, 1)]), "answers[0]", "names document 3, but there are 1"),
        (dict(candidates=[Candidate("x", [(0, 1)])]), "candidates[0].mentions[0]", "must be a TextSpan"),
        (dict(dom_nodes=[DomNode(TextSpan(0, 0, 1), ["big"])]), "dom_nodes[0].features", "must be a list of numbers"),
    ],
)
def test_validation_names_example_and_field(changes, field, problem):
    with pytest.raises(InputError) as error:
        example(**changes).validate()
    assert f"example 'e1': field '{field}'" in str(error.value) and problem in str(error.value)


def test_valid_example_round_trips_through_json():
    original = example().validate()
    assert example_from_json(example_to_json(original)) == original


def test_document_from_text_and_locations():
    text = "One. Two here.\n\nThree."
    document = Document.from_text(text)
    # paragraph 1 is 0..14 with sentences 0..4 and 5..14; paragraph 2 is 16..22
    assert document.paragraphs == [Paragraph(Span(0, 14), [Span(0, 4), Span(5, 14)]),
                                   Paragraph(Span(16, 22), [Span(16, 22)])]
    ex = StructuredExample("x", "", [document, Document.from_text("Four.")])
    assert ex.paragraph_locations() == [(0, 0), (0, 1), (1, 0)]
    assert ex.sentence_locations() == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0)]
