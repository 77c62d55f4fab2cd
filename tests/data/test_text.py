"""Plain text: UTF-8 decoding with warnings, paragraph and sentence splitting (hand-checked spans)."""

import pytest

from longdoc.data.text import decode_text, replace_lone_surrogates, split_paragraphs, split_sentences, token_char_spans


def test_valid_utf8_decodes_silently(recwarn):
    assert decode_text("café".encode(), "x") == "café"
    assert not recwarn.list


def test_invalid_utf8_is_replaced_with_a_counted_warning():
    # b"\xff" and b"\xc3(" hold two invalid sequences: each becomes one U+FFFD; "(" survives.
    with pytest.warns(UserWarning, match=r"doc\.txt: not valid UTF-8; 2 invalid byte sequence"):
        text = decode_text(b"a\xffb \xc3(", "doc.txt")
    assert text == "a\ufffdb \ufffd("


def test_lone_surrogates_are_replaced_one_for_one():
    with pytest.warns(UserWarning, match="1 unpaired surrogate"):
        assert replace_lone_surrogates("a\ud800b", "q") == "a\ufffdb"


def test_paragraphs_split_on_blank_lines():
    text = "First one.\nstill first.\n\n  \nSecond.\n\nThird\n"
    # "First one.\nstill first." is 10 + 1 + 12 = 23 characters: 0..23; the break "\n\n  \n" takes
    # 23..28, so "Second." is 28..35; "\n\n" is 35..37 and "Third" 37..42 (no trailing newline).
    assert split_paragraphs(text) == [(0, 23), (28, 35), (37, 42)]
    assert [text[a:b] for a, b in split_paragraphs(text)] == ["First one.\nstill first.", "Second.", "Third"]


def test_sentence_rule():
    text = 'Mr. Smith met J. R. R. Tolkien in 1950. "Really?" she asked. It was e.g. true! 42 is a number'
    sentences = [text[a:b] for a, b in split_sentences(text)]
    # "Mr." (abbreviation) and "J." / "R." (initials) end no sentence; "1950." does (a quote follows);
    # "asked." does; "e.g." does not; "true!" does (a digit follows).
    assert sentences == [
        "Mr. Smith met J. R. R. Tolkien in 1950.",
        '"Really?" she asked.',
        "It was e.g. true!",
        "42 is a number",
    ]


def test_sentences_within_a_range_and_lowercase_continuation():
    text = "xx The end. it goes on. Then stop.  "
    # Within [3, 36): "The end. it goes on." stays one sentence (lowercase "it" after the period).
    assert [text[a:b] for a, b in split_sentences(text, 3, len(text))] == ["The end. it goes on.", "Then stop."]


def test_token_char_spans_of_space_separated_tokens():
    text = "<P> Rome  is"  # two spaces: an empty token between them, as split(" ") gives
    spans = token_char_spans(text)
    assert [text[start:end] for start, end in spans] == text.split(" ") == ["<P>", "Rome", "", "is"]
    assert spans == [(0, 3), (4, 8), (9, 9), (10, 12)]
    assert token_char_spans("") == [(0, 0)]
