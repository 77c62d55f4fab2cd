"""Documents for `longdoc ask`: decoding, HTML text, folders and bad input; passages along the
text's structure with exact offsets (non-ASCII, Windows line endings)."""

import os

import pytest

from longdoc.ask import documents
from longdoc.ask.documents import html_to_text, load_sources
from longdoc.ask.passages import split_passages


def words(texts):
    """A stand-in tokenizer for passage tests: one token per word."""
    return [len(text.split()) for text in texts]


def test_text_files_decode_with_replacement_and_exact_characters(tmp_path):
    (tmp_path / "a.txt").write_bytes("Zoë went to Zürich.\r\n\r\nThen home.".encode("utf-8"))
    (tmp_path / "b.md").write_bytes(b"Bad byte \xff here.")
    with pytest.warns(UserWarning, match=r"b\.md: not valid UTF-8; 1 invalid"):
        sources, errors = load_sources([tmp_path / "a.txt", tmp_path / "b.md"])
    assert errors == []
    assert [s.text for s in sources] == ["Zoë went to Zürich.\r\n\r\nThen home.", "Bad byte \ufffd here."]
    assert not sources[0].extracted and len(sources[0].sha256) == 64


def test_html_keeps_visible_text_in_blocks():
    markup = ("<html><head><title>T</title><style>p {}</style></head><body><h1>Café  &amp; Co</h1>"
              "<p>First  para.\nStill <b>bold</b> here.</p><p>Second<br>line</p><script>x = 1</script>"
              "<ul><li>a</li><li>b</li></ul>tail</body></html>")
    assert html_to_text(markup) == "Café & Co\n\nFirst para. Still bold here.\n\nSecond\nline\n\na\n\nb\n\ntail"


def test_folders_and_bad_input_give_one_error_each_and_keep_the_rest(tmp_path):
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "page.htm").write_text("<p>Hello <i>there</i>.</p>", encoding="utf-8")
    (folder / "notes.txt").write_text("Some notes.", encoding="utf-8")
    (folder / "image.png").write_bytes(b"\x89PNG\r\n")  # not a supported type: skipped inside folders
    (tmp_path / "empty.txt").write_text(" \n\n ", encoding="utf-8")
    (tmp_path / "binary.txt").write_bytes(b"abc\x00def")
    (tmp_path / "nothing").mkdir()
    (tmp_path / "data.xlsx").write_bytes(b"PK\x03\x04")
    sources, errors = load_sources([folder, tmp_path / "missing.txt", tmp_path / "empty.txt",
                                    tmp_path / "binary.txt", tmp_path / "nothing", tmp_path / "data.xlsx"])
    assert [(s.path.replace(str(folder), "DOCS"), s.text, s.extracted) for s in sources] == [
        ("DOCS/notes.txt", "Some notes.", False), ("DOCS/sub/page.htm", "Hello there.", True)]
    messages = [str(error).replace(str(tmp_path), "T") for error in errors]
    assert messages[0] == "T/missing.txt: no such file or folder"
    assert messages[1] == "T/empty.txt: empty file (no text)"
    assert messages[2].startswith("T/binary.txt: binary file")
    assert messages[3].startswith("T/nothing: folder has no supported file")
    assert messages[4].startswith("T/data.xlsx: unsupported file type '.xlsx'")
    assert all("\n" not in message for message in messages)


def test_a_subfolder_that_cannot_be_listed_is_named_once_and_the_rest_is_read(tmp_path, monkeypatch):
    (tmp_path / "docs" / "locked").mkdir(parents=True)
    (tmp_path / "docs" / "locked" / "hidden.txt").write_text("Not listed.", encoding="utf-8")
    (tmp_path / "docs" / "open.txt").write_text("Readable.", encoding="utf-8")
    listing = os.scandir

    def scandir(path):  # as for a folder without read permission (this test may run as root)
        if os.path.basename(path) == "locked":
            raise PermissionError(13, "Permission denied", path)
        return listing(path)

    monkeypatch.setattr(documents.os, "scandir", scandir)
    sources, errors = load_sources([tmp_path / "docs"])
    assert [source.text for source in sources] == ["Readable."]
    locked = tmp_path / "docs" / "locked"
    assert [str(error) for error in errors] == [f"{locked}: cannot read folder: Permission denied"]


def test_passages_follow_paragraphs_and_sentences_with_exact_offsets():
    text = ("Überblick\r\n\r\nDas ist gut. Noch ein Satz hier.\r\n\r\n"
            + " ".join(f"Sentence number {i} is here." for i in range(12)) + "\r\n\r\nLast one.")
    passages = split_passages(text, words, max_tokens=20, min_tokens=3)
    # The heading (one word) joins the next paragraph; the long paragraph is cut between sentences.
    assert text[passages[0].start:passages[0].end] == "Überblick\r\n\r\nDas ist gut. Noch ein Satz hier."
    for passage in passages:
        assert words([text[passage.start:passage.end]])[0] <= 20 or len(passage.sentences) == 1
        assert passage.sentences[0][0] == passage.start and passage.sentences[-1][1] == passage.end
        for start, end in passage.sentences:
            assert text[start:end] == text[start:end].strip() and "\r" not in text[start:end].strip("\r\n")
    middle = [text[s:e] for p in passages[1:-1] for s, e in p.sentences]
    assert middle == [f"Sentence number {i} is here." for i in range(12)]
    # The short last paragraph has nothing to join: it stays a passage of its own.
    assert text[passages[-1].start:passages[-1].end] == "Last one."


def test_a_sentence_longer_than_a_passage_is_cut_at_spaces():
    text = " ".join(f"w{i}" for i in range(50))
    passages = split_passages(text, words, max_tokens=20, min_tokens=1)
    pieces = [text[s:e] for p in passages for s, e in p.sentences]
    assert " ".join(pieces) == text and all(len(piece.split()) <= 10 for piece in pieces)


def test_a_link_out_of_a_given_folder_is_not_read_and_a_file_named_is(tmp_path):
    # One rule for ask, index and serve: a folder stands for what lies in it.
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "inside.txt").write_text("Inside the folder.\n", encoding="utf-8")
    (tmp_path / "secret.txt").write_text("Outside the folder.\n", encoding="utf-8")
    (tmp_path / "docs" / "link-out.txt").symlink_to(tmp_path / "secret.txt")
    (tmp_path / "docs" / "link-in.txt").symlink_to(tmp_path / "docs" / "inside.txt")
    sources, errors = load_sources([tmp_path / "docs"])
    assert [source.path for source in sources] == [str(tmp_path / "docs" / "inside.txt")]  # the link in: a repeat
    assert [(error.path, error.problem) for error in errors] == [
        (str(tmp_path / "docs" / "link-out.txt"),
         f"links to {tmp_path / 'secret.txt'}, outside {tmp_path / 'docs'}; not read (name the file itself to read it)")]
    sources, errors = load_sources([tmp_path / "docs" / "link-out.txt"])
    assert [source.text for source in sources] == ["Outside the folder.\n"] and not errors
