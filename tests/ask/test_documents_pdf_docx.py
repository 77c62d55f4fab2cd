"""PDF and DOCX documents for `longdoc ask`: the extracted text keeps pages/paragraphs as blank-line
paragraphs, and a PDF without a text layer or a truncated PDF/DOCX gives one line and exit 2."""

import json
from pathlib import Path

import docx
import pytest

from longdoc.ask.documents import load_sources, read_source
from longdoc.cli import main
from tests.conftest import new_cache

from .test_ask_command import model_dir  # noqa: F401  (the tiny untrained reader, a fixture)


def minimal_pdf(pages: list[list[str]]) -> bytes:
    """A valid PDF, one page per entry, each line of a page drawn in Helvetica on its own line;
    an empty list gives a page with no text layer (what a scan without OCR looks like)."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", None, "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for lines in pages:
        ops = "".join(f"BT /F1 12 Tf 72 {720 - 40 * i} Td ({line}) Tj ET\n" for i, line in enumerate(lines))
        objects.append(f"<< /Length {len(ops)} >>\nstream\n{ops}endstream")
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
                       f"/Resources << /Font << /F1 3 0 R >> >> /Contents {len(objects)} 0 R >>")
        kids.append(f"{len(objects)} 0 R")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(kids)} >>"
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


PAGES = [["Ada Quell works for Orbix Group."], ["Orbix Group is based in Tallinnford.", "It sells lamps."]]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "facts.pdf").write_bytes(minimal_pdf(PAGES))
    document = docx.Document()
    for paragraph in ("Åsa Lind works for Kettle Labs.", "", "Kettle Labs is based in Søndervik."):
        document.add_paragraph(paragraph)
    document.save(tmp_path / "facts.docx")
    return tmp_path


def test_pdf_pages_become_paragraphs_with_offsets_into_the_extracted_text(files):
    source = read_source(files / "facts.pdf")
    assert source.extracted_from == "PDF"
    paragraphs = source.text.split("\n\n")
    assert paragraphs[0] == "Ada Quell works for Orbix Group."
    assert "Tallinnford" in paragraphs[1] and "lamps" in paragraphs[1]
    start = source.text.index("Tallinnford")
    assert source.text[start:start + len("Tallinnford")] == "Tallinnford"


def test_docx_paragraphs_in_order_and_empty_ones_dropped(files):
    source = read_source(files / "facts.docx")
    assert source.extracted_from == "DOCX"
    assert source.text == "Åsa Lind works for Kettle Labs.\n\nKettle Labs is based in Søndervik."


def test_folder_picks_up_pdf_and_docx(files):
    sources, errors = load_sources([files])
    assert errors == []
    assert sorted(s.path.rsplit(".", 1)[1] for s in sources) == ["docx", "pdf"]


@pytest.mark.parametrize("name, data, expected", [
    ("scan.pdf", minimal_pdf([[]]), "a PDF with no text layer (scanned?): longdoc reads text, run OCR first"),
    ("cut.pdf", minimal_pdf(PAGES)[:200], "not a readable PDF"),
    ("cut.docx", None, "not a readable .docx"),
])
def test_bad_pdf_or_docx_is_one_line_and_exit_2(files, tmp_path, capsys, name, data, expected):
    if data is None:
        data = (files / "facts.docx").read_bytes()[:300]
    (tmp_path / name).write_bytes(data)
    problem = read_source(tmp_path / name)
    assert str(problem).startswith(f"{tmp_path / name}: {expected}")
    assert main(["ask", "--question", "q", str(tmp_path / name)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"longdoc ask: error: {problem}"]  # and nothing from pypdf


def test_pdf_text_records_the_page_of_every_offset(tmp_path):
    # The middle page has no text layer: it holds no offset, and the pages after it keep their numbers.
    (tmp_path / "three.pdf").write_bytes(minimal_pdf([PAGES[0], [], PAGES[1]]))
    source = read_source(tmp_path / "three.pdf")
    assert source.text == "Ada Quell works for Orbix Group.\n\nOrbix Group is based in Tallinnford. It sells lamps."
    assert source.page_at(source.text.index("Ada")) == 1
    assert source.page_at(source.text.index("Group.")) == 1
    assert source.page_at(source.text.index("Orbix Group is")) == 3
    assert source.page_at(len(source.text) - 1) == 3
    assert read_source(tmp_path / "three.pdf").page_starts == (0, 32, 34)
    assert read_source(Path(tmp_path / "three.pdf")).page_at(33) == 2  # the blank line between pages 1 and 3


def _page_in_pdf(text: str, start: int) -> int:
    return 1 if start < text.index("Orbix Group is based") else 2


def test_ask_answers_from_pdf_and_docx_with_offsets_into_the_extracted_text(model_dir, files, capsys, monkeypatch):
    monkeypatch.setenv("LONGDOC_CACHE", str(new_cache(files / "cache")))
    paths = [str(files / "facts.pdf"), str(files / "facts.docx")]
    argv = ["ask", "--model", str(model_dir / "model"), "--question", "Where is the employer of Ada based?",
            "--top-k", "5", "--min-score", "0", "--min-evidence", "-1", *paths]
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    extracted = {}
    for path in paths:  # what `longdoc ask --extract FILE` prints is the text the offsets count in
        assert main(["ask", "--extract", path]) == 0
        extracted[path] = capsys.readouterr().out
        assert extracted[path] == read_source(Path(path)).text
    assert result["passages"] and result["answers"]
    places = [*result["passages"], *result["answers"], *(s for answer in result["answers"] for s in answer["support"])]
    for place in places:
        assert 0 <= place["start"] < place["end"] <= len(extracted[place["file"]])
        if place["file"] == paths[0]:
            assert place["page"] == _page_in_pdf(extracted[paths[0]], place["start"])
        else:
            assert "page" not in place
    for answer in result["answers"]:
        assert answer["text"] == extracted[answer["file"]][answer["start"]:answer["end"]]
        for sentence in answer["support"]:
            assert sentence["text"] == extracted[sentence["file"]][sentence["start"]:sentence["end"]]
    assert {d["file"] for d in result["documents"]} == set(paths)
    assert {d["file"]: d["offsets_into"] for d in result["documents"]} == {
        paths[0]: "text extracted from PDF", paths[1]: "text extracted from DOCX"}
    # The text output places a PDF answer as FILE:pPAGE:LINE:COLUMN of the extracted text.
    assert main(argv) == 0
    printed = capsys.readouterr().out
    for answer in result["answers"]:
        text, start = extracted[answer["file"]], answer["start"]
        line = text.count("\n", 0, start) + 1
        column = start - (text.rfind("\n", 0, start) + 1) + 1
        page = f"p{_page_in_pdf(text, start)}:" if answer["file"] == paths[0] else ""
        assert f"at {answer['file']}:{page}{line}:{column} (extracted text)" in printed


def test_extract_refuses_what_ask_refuses(files, tmp_path, capsys):
    (tmp_path / "scan.pdf").write_bytes(minimal_pdf([[]]))
    assert main(["ask", "--extract", str(tmp_path / "scan.pdf")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"longdoc ask: error: {tmp_path / 'scan.pdf'}: a PDF with no text layer (scanned?): longdoc reads text, "
        "run OCR first"]
    assert main(["ask", "--extract", str(files)]) == 2
    assert "a folder; --extract takes one file" in capsys.readouterr().err
    assert main(["ask", "--extract", str(files / "facts.pdf"), str(files / "facts.docx")]) == 2
    assert "give no PATH, --question or --model with it" in capsys.readouterr().err
