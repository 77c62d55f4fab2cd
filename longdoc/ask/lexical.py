"""The lexical ranking of `longdoc ask`: BM25 over sentences, by SQLite's FTS5.

FTS5 (in Python's standard library through `sqlite3`) keeps an inverted index in one file and ranks
matches with its built-in `bm25()` (Robertson and Zaragoza's Okapi BM25, k1 = 1.2, b = 0.75, the
FTS5 documentation's values): a sentence that names the question's rare words (a person, a company)
together with its relation word ranks first even among many sentences that state the same relation
for others, which is where a sentence embedding, which hears the relation more than the name, ranks
them all alike. The rows are sentences, not passages: a person named in many passages in passing
and a relation stated in many passages about others make many passages hold both words, while one
sentence holds both together (`longdoc.ask.index.CorpusIndex.search_text` ranks each passage by its
best sentence).

Tokens: `unicode61` (letters and digits, case and diacritics folded, every script's letters) then
the Porter stemmer ("works" and "work" match). A query is every distinct word of its text but the
English stop words of Lucene's classic analyzer (`STOP_WORDS`, the default of its English analysis:
"the", "of", "was" carry no topic, and where a text happens to use them rarely their IDF would
outweigh a relation word), each a quoted FTS5 string joined with OR: no word of the question is
FTS5 syntax, and a question with no word the documents contain matches nothing (an empty ranking,
never an error). The index keeps every word; only queries drop stop words.

The index of one document lives in its `ask` cache folder (`longdoc.ask.index`) as one SQLite file,
built in a temporary file of that folder and renamed over the target when complete.
"""

import os
import re
import sqlite3
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Sequence

TOKENIZER = "porter unicode61 remove_diacritics 2"
LEXICAL_FORMAT = 1  # bump when the table or its tokenizer change: cached indexes are keyed by it
_WORD = re.compile(r"\w+")
STOP_WORDS = frozenset("a an and are as at be but by for if in into is it no not of on or such that the their then "
                       "there these they this to was will with".split())


def match_expression(text: str) -> str:
    """`text`'s distinct words but STOP_WORDS as an FTS5 query that matches a row holding any of them
    ("" when none)."""
    words = dict.fromkeys(word for word in map(str.lower, _WORD.findall(text)) if word not in STOP_WORDS)
    return " OR ".join('"' + word.replace('"', '""') + '"' for word in words)


def _create(connection: sqlite3.Connection, texts: Iterable[str]) -> None:
    # Contentless (content=''): the texts stay in the documents; the file holds the index only.
    connection.execute(f"CREATE VIRTUAL TABLE sentences USING fts5(body, content='', tokenize='{TOKENIZER}')")
    connection.executemany("INSERT INTO sentences(rowid, body) VALUES (?, ?)", enumerate(texts))
    connection.commit()


class LexicalIndex:
    """BM25 over rows numbered 0, 1, ... (one row per sentence)."""

    def __init__(self, connection: sqlite3.Connection):
        self.connection = connection

    @classmethod
    def in_memory(cls, texts: Iterable[str]) -> "LexicalIndex":
        connection = sqlite3.connect(":memory:", check_same_thread=False)
        _create(connection, texts)
        return cls(connection)

    @classmethod
    def open(cls, path: Path, rows: int) -> "LexicalIndex":
        """The index file at `path`, read-only; ValueError when it is not an index of `rows` rows."""
        connection = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro&immutable=1", uri=True,
                                     check_same_thread=False)
        try:
            found = connection.execute("SELECT count(*) FROM sentences_docsize").fetchone()[0]
        except sqlite3.DatabaseError as error:
            connection.close()
            raise ValueError(f"not a lexical index ({error})") from None
        if found != rows:
            connection.close()
            raise ValueError(f"the lexical index has {found} sentences, the document {rows}")
        return cls(connection)

    def close(self) -> None:
        self.connection.close()

    def search(self, text: str) -> Iterator[tuple[int, float]]:
        """The rows sharing a word with `text`, best first: (row, BM25 score), fetched as they are read."""
        expression = match_expression(text)
        if not expression:
            return
        # FTS5's bm25() is negated (lower is better, so that ORDER BY ... ASC ranks best first).
        for row, score in self.connection.execute("SELECT rowid, bm25(sentences) FROM sentences WHERE sentences "
                                                  "MATCH ? ORDER BY bm25(sentences)", (expression,)):
            yield row, -score


def write_lexical_index(path: Path, texts: Sequence[str]) -> None:
    """The index of the sentences `texts` (row i: texts[i]) at `path`, written whole or not at all."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(descriptor)
    try:
        connection = sqlite3.connect(temporary)
        try:
            connection.execute("PRAGMA journal_mode = OFF")  # a fresh file: nothing to roll back
            _create(connection, texts)
        finally:
            connection.close()
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
