"""User documents for `longdoc ask`: paths and folders -> decoded texts, with one-line errors.

Supported: .txt and .md (the file's text), .html and .htm (the text a browser would show, taken
with the standard library's `html.parser`), .pdf (each page's text layer, read with `pypdf`) and
.docx (the body's paragraphs, read with `python-docx`). For HTML, PDF and DOCX answer offsets refer
to the extracted text, which `SourceText.extracted` records and the JSON output states (`longdoc ask
--extract FILE` prints it); a PDF's text also records where each page starts (`SourceText.page_at`). A folder stands for every supported
file under it, in sorted order. Bytes that are not UTF-8 are replaced (U+FFFD) with a warning
(`longdoc.io.decode_text`); offsets are character offsets into the decoded text.

A file that is missing, unreadable, binary (a NUL byte in its first 8 KiB; PDF and DOCX excepted),
of an unsupported type, empty (nothing but whitespace), a PDF without a text layer, or a PDF/DOCX
that cannot be parsed, and a folder with no supported file, give a `SourceError`
naming the path; the other files are still read (`load_sources` returns both lists). So does a file
that a symbolic link inside a given folder brings in from outside that folder: a folder stands for
what lies in it (`longdoc serve` shows its documents to whoever reaches its page, and ask, index and
serve read the same documents, so that they share one corpus index); a file given by name is read
wherever it is.

Given what a corpus index recorded of the files, `load_sources` leaves unread those whose signature
is unchanged (`file_signature`); their text is read when first used, and its hash checked then.
"""

import bisect
import functools
import hashlib
import io
import logging
import os
import zipfile
import re
import time
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Iterable, Mapping, NamedTuple

from longdoc.errors import InputError
from longdoc.io import decode_text

TEXT_SUFFIXES = (".txt", ".md")
HTML_SUFFIXES = (".html", ".htm")
PDF_SUFFIXES = (".pdf",)
DOCX_SUFFIXES = (".docx",)
SUPPORTED_SUFFIXES = TEXT_SUFFIXES + HTML_SUFFIXES + PDF_SUFFIXES + DOCX_SUFFIXES
EXTRACTED_SUFFIXES = HTML_SUFFIXES + PDF_SUFFIXES + DOCX_SUFFIXES
BINARY_PROBE_BYTES = 8192


# A file whose modification or change time is this close to when its status was taken may change
# again within the same timestamp (a coarse clock ticks every few milliseconds, some file systems
# every second or two): its status is not recorded, and the next run hashes it (git's racy-clean rule).
RACY_NS = 2_000_000_000
FileSignature = tuple[int, int, int, int, int]  # st_size, st_mtime_ns, st_ctime_ns, st_ino, st_dev


def signature_text(signature: FileSignature) -> str:
    """The signature as a corpus index records it: its JSON (`json.dumps` of its list), made by hand
    because a question over 10,000 files compares 10,000 of them."""
    return "[" + ", ".join(map(str, signature)) + "]"


def file_signature(status: os.stat_result) -> FileSignature | None:
    """What says a file has not changed since `status` was taken (its size, modification and change
    times, inode and device: git's checks; the change time moves on any write or `os.utime`, and
    nobody sets it back); None when the file changed too recently for its times to tell (RACY_NS)."""
    if max(status.st_mtime_ns, status.st_ctime_ns) >= time.time_ns() - RACY_NS:
        return None
    return status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_ino, status.st_dev


class SourceText:
    """One readable document: its path as given, its text, the hash of its bytes, and the file's
    signature when they were read (None: racy, or not read from a file). A document whose file
    still has the signature the corpus index recorded (`SourceText.unread`) has its text read when
    first used, and checked against the hash then."""

    def __init__(self, path: str, text: str | None, sha256: str, extracted: bool, page_starts: tuple[int, ...] = (),
                 signature: FileSignature | None = None):
        self.path, self._text, self.sha256 = path, text, sha256
        # True: `text` is the text extracted from HTML, PDF or DOCX, not the file's own characters.
        self.extracted = extracted
        self.page_starts = page_starts  # a PDF's: the offset in `text` where each page's text starts, page 1 first
        self.signature = signature

    @classmethod
    def unread(cls, path: str, resolved: str, sha256: str, page_starts: tuple[int, ...],
               signature: FileSignature) -> "SourceText":
        """A document known by the index, whose text is read when first used."""
        source = cls(path, None, sha256, os.path.splitext(path)[1].lower() in EXTRACTED_SUFFIXES, page_starts,
                     signature)
        source.__dict__["resolved_path"] = resolved
        return source

    @property
    def text(self) -> str:
        if self._text is None:
            read = read_source(Path(self.path))
            if isinstance(read, SourceError):
                raise InputError(f"{read}; it was readable when this question began")
            if read.sha256 != self.sha256:
                raise InputError(f"{self.path}: changed while this question was answered (its index is of the "
                                 "earlier contents); ask again to index it again")
            self._text = read.text
        return self._text

    def __repr__(self) -> str:
        return f"SourceText({self.path!r}, sha256={self.sha256[:12]}, {'read' if self._text is not None else 'unread'})"

    @functools.cached_property
    def resolved_path(self) -> str:
        """The path resolved (links followed), worked out once: a corpus of 10,000 files asks for it on
        every open, and each resolution reads every folder of the path."""
        return str(Path(self.path).resolve())

    def page_at(self, offset: int) -> int | None:
        """The PDF page (from 1) that the character at `offset` of `text` comes from; None for other files."""
        return bisect.bisect_right(self.page_starts, offset) if self.page_starts else None

    @property
    def extracted_from(self) -> str | None:
        """The format the text was extracted from ("HTML", "PDF", "DOCX"), None for a plain text file."""
        if not self.extracted:
            return None
        suffix = Path(self.path).suffix.lower()
        return "PDF" if suffix in PDF_SUFFIXES else "DOCX" if suffix in DOCX_SUFFIXES else "HTML"


@dataclass(frozen=True)
class SourceError:
    path: str
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


# Elements whose content is never shown, and those that start a new block (a paragraph break).
_HIDDEN = frozenset({"script", "style", "head", "template", "noscript", "svg"})
_BLOCKS = frozenset(
    "address article aside blockquote body dd details div dl dt fieldset figcaption figure footer form h1 h2 "
    "h3 h4 h5 h6 header hr li main nav ol p pre section table tbody td tfoot th thead tr ul".split()
)
_SPACE_RUN = re.compile(r"\s+")


class _TextExtractor(HTMLParser):
    """Visible text; blocks separated by blank lines (so `split_paragraphs` sees them), <br> as a
    line break, runs of whitespace inside text as one space (as a browser renders them)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden_depth = 0

    def _ending(self) -> str:
        return "".join(self.parts[-2:])[-2:]

    def _break(self, separator: str) -> None:
        if not self.parts:
            return
        if self.parts[-1].endswith(" "):
            self.parts[-1] = self.parts[-1].rstrip(" ")
        ending = self._ending()
        if separator == "\n\n":
            self.parts.append("\n" * (2 - (len(ending) - len(ending.rstrip("\n")))))
        elif not ending.endswith("\n"):
            self.parts.append("\n")

    def handle_starttag(self, tag, attrs):
        if tag in _HIDDEN:
            self.hidden_depth += 1
        elif tag == "br":
            self._break("\n")
        elif tag in _BLOCKS:
            self._break("\n\n")

    def handle_endtag(self, tag):
        if tag in _HIDDEN:
            self.hidden_depth = max(0, self.hidden_depth - 1)
        elif tag in _BLOCKS:
            self._break("\n\n")

    def handle_data(self, data):
        if self.hidden_depth:
            return
        text = _SPACE_RUN.sub(" ", data)
        if not self.parts or self._ending()[-1:] in ("\n", " "):
            text = text.lstrip(" ")
        if text:
            self.parts.append(text)


def html_to_text(markup: str) -> str:
    """The visible text of an HTML document (see `_TextExtractor`); entities decoded."""
    parser = _TextExtractor()
    parser.feed(markup)
    parser.close()
    return "".join(parser.parts).strip()


_BLANK_LINE = re.compile(r"\n[ \t]*\n")


def _paragraphs_text(paragraphs: Iterable[str]) -> str:
    """Paragraphs joined by blank lines (what `split_paragraphs` splits on); the line wraps and
    whitespace runs inside one paragraph become single spaces, so a sentence is not cut at a wrap."""
    return "\n\n".join(joined for joined in (_SPACE_RUN.sub(" ", p).strip() for p in paragraphs) if joined)


class DocumentFormatError(ValueError):
    """A PDF or DOCX file that its parser refuses (truncated, corrupt, encrypted)."""


def pdf_to_text(data: bytes) -> tuple[str, tuple[int, ...]]:
    """The text layer of a PDF: pages in order, each page's blank-line paragraphs kept as paragraphs;
    and the offset in that text where each page starts (a page without text starts where the next
    page's text would)."""
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    # pypdf logs what it repairs (a missing EOF marker, a bad xref) as warnings; the user gets one
    # line per file from us instead, so they are dropped for the duration of this read only.
    pypdf_log = logging.getLogger("pypdf")
    level = pypdf_log.level
    pypdf_log.setLevel(logging.ERROR)
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise DocumentFormatError("encrypted PDF; expected an unencrypted PDF")
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError) as error:
        if isinstance(error, DocumentFormatError):
            raise
        raise DocumentFormatError(f"not a readable PDF ({type(error).__name__}: {error}); expected a valid PDF file")
    finally:
        pypdf_log.setLevel(level)
    text, starts = "", []
    for page in pages:
        page_text = _paragraphs_text(_BLANK_LINE.split(page))
        if text and page_text:
            text += "\n\n"  # pages apart as paragraphs are
        starts.append(len(text))
        text += page_text
    return text, tuple(starts)


def docx_to_text(data: bytes) -> str:
    """The body paragraphs of a Word .docx document, one paragraph each."""
    import docx
    from docx.opc.exceptions import PackageNotFoundError

    try:
        document = docx.Document(io.BytesIO(data))
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as error:
        raise DocumentFormatError(f"not a readable .docx ({type(error).__name__}: {error}); "
                                  "expected a Word .docx file (a ZIP package)")
    return _paragraphs_text(paragraph.text for paragraph in document.paragraphs)


def _expand(path: Path) -> tuple[list[tuple[str, bool]], list[SourceError]]:
    """The supported files a path stands for, each as a string (a corpus of 10,000 files: pathlib's
    objects cost more than the stat calls) and whether it is a link, a folder's in the order of their
    parts as pathlib sorts them; or the errors that say why there are none, or which subfolder could
    not be read. A folder's links to folders are not followed."""
    if path.is_dir():
        files: list[tuple[str, bool]] = []
        errors = _walk(str(path), files)
        if not files and not errors:
            return [], [SourceError(str(path), f"folder has no supported file ({', '.join(SUPPORTED_SUFFIXES)})")]
        return sorted(files, key=lambda file: file[0].split(os.sep)), errors
    if not path.exists():
        return [], [SourceError(str(path), "no such file or folder")]
    if path.suffix.lower() not in SUPPORTED_SUFFIXES:
        return [], [SourceError(str(path), f"unsupported file type {path.suffix or '(none)'!r}; "
                                           f"supported: {', '.join(SUPPORTED_SUFFIXES)}")]
    return [(str(path), path.is_symlink())], []


def _walk(folder: str, files: list[tuple[str, bool]]) -> list[SourceError]:
    """Adds the supported files under `folder` to `files` (see `_expand`): the folder's own listing
    says what each entry is, where a link needs no status call (the links among them need one)."""
    errors, subfolders = [], []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    subfolders.append(entry.path)
                elif os.path.splitext(entry.name)[1].lower() in SUPPORTED_SUFFIXES and entry.is_file():
                    files.append((entry.path, entry.is_symlink()))
    except OSError as error:
        return [SourceError(folder, f"cannot read folder: {error.strerror or error}")]
    for subfolder in subfolders:
        errors += _walk(subfolder, files)
    return errors


def read_source(path: Path) -> SourceText | SourceError:
    """One file as a SourceText, or the SourceError that says why it cannot be read."""
    try:
        with open(path, "rb") as file:
            status = os.fstat(file.fileno())  # before reading: a write meanwhile changes what is recorded
            data = file.read()
    except OSError as error:
        return SourceError(str(path), f"cannot read: {error.strerror or error}")
    signature = file_signature(status)
    suffix = path.suffix.lower()
    if suffix in PDF_SUFFIXES + DOCX_SUFFIXES:
        try:
            text, page_starts = pdf_to_text(data) if suffix in PDF_SUFFIXES else (docx_to_text(data), ())
        except DocumentFormatError as error:
            return SourceError(str(path), str(error))
        if not text.strip():
            return SourceError(str(path), "a PDF with no text layer (scanned?): longdoc reads text, run OCR first"
                               if suffix in PDF_SUFFIXES else "no text in this .docx's paragraphs")
        return SourceText(str(path), text, hashlib.sha256(data).hexdigest(), True, page_starts, signature)
    if b"\x00" in data[:BINARY_PROBE_BYTES]:
        return SourceError(str(path), "binary file (contains NUL bytes), not text")
    text = decode_text(data, str(path))
    extracted = suffix in HTML_SUFFIXES
    if extracted:
        text = html_to_text(text)
    if not text.strip():
        return SourceError(str(path), "empty file (no text)" if not extracted else "no visible text in this HTML")
    return SourceText(str(path), text, hashlib.sha256(data).hexdigest(), extracted, (), signature)


class IndexedFile(NamedTuple):
    """What a corpus index recorded of a file: its signature when read (`signature_text`; None: none
    recorded), the hash of its bytes and a PDF's page starts."""

    signature: str | None
    sha256: str
    page_starts: tuple[int, ...]


def load_sources(paths: Iterable[str | os.PathLike], indexed: Mapping[str, IndexedFile] | None = None
                 ) -> tuple[list[SourceText], list[SourceError]]:
    """Every readable document under `paths` (files and folders), and an error for each that is not.
    `indexed`: what a corpus index recorded of files, by resolved path; a file whose signature is the
    one recorded is not read (`SourceText.unread`), as git and make trust a file's status; the others
    are read and hashed, and the hash decides whether they changed."""
    sources, errors, seen = [], [], set()
    for given in map(Path, paths):
        files, problems = _expand(given)
        errors.extend(problems)
        folder, root, top = given.is_dir(), os.path.realpath(given), str(given)
        inside = root.rstrip(os.sep) + os.sep
        for file, link in files:
            # A folder's walk went through no link to a folder: below the folder, only the file itself
            # can be a link (where resolving the whole path reads every folder of it).
            key = inside + file[len(top):].lstrip(os.sep) if folder and not link else os.path.realpath(file)
            if folder and key != root and not key.startswith(inside):
                errors.append(SourceError(file, f"links to {key}, outside {given}; not read (name the file "
                                                "itself to read it)"))
                continue
            if key in seen:
                continue
            seen.add(key)
            known = None if indexed is None else indexed.get(key)
            if known is not None and known.signature is not None:
                signature = _signature_of(key)
                if signature is not None and signature_text(signature) == known.signature:
                    sources.append(SourceText.unread(file, key, known.sha256, known.page_starts, signature))
                    continue
            result = read_source(Path(file))
            if isinstance(result, SourceError):
                errors.append(result)
            else:
                result.__dict__["resolved_path"] = key
                sources.append(result)
    return sources, errors


def _signature_of(path: str) -> FileSignature | None:
    try:
        return file_signature(os.stat(path))
    except OSError:
        return None
