"""Plain text: paragraph and sentence splitting, pre-tokenized text's spans (hand-checked spans)."""

from longdoc.data.text import split_paragraphs, split_sentences, token_char_spans


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
