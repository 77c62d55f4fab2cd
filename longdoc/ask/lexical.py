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

The rows of a whole corpus live in one table of its index file (`longdoc.ask.index`), numbered by
that file: `add_rows` and `delete_rows` change them inside the caller's transaction. The table keeps
the sentences' text (SQLite's FTS5 deletes a row of a table without its content only from 3.43 on),
so a changed document's rows are replaced without its old text, and BM25's word statistics are
always those of the documents indexed.
"""

import re
import sqlite3
from typing import Iterable, Iterator

TOKENIZER = "porter unicode61 remove_diacritics 2"
LEXICAL_FORMAT = 2  # bump when the table or its tokenizer change: cached indexes are keyed by it
_WORD = re.compile(r"\w+")
STOP_WORDS = frozenset("a an and are as at be but by for if in into is it no not of on or such that the their then "
                       "there these they this to was will with".split())


def match_expression(text: str) -> str:
    """`text`'s distinct words but STOP_WORDS as an FTS5 query that matches a row holding any of them
    ("" when none)."""
    words = dict.fromkeys(word for word in map(str.lower, _WORD.findall(text)) if word not in STOP_WORDS)
    return " OR ".join('"' + word.replace('"', '""') + '"' for word in words)


def create_table(connection: sqlite3.Connection) -> None:
    connection.execute(f"CREATE VIRTUAL TABLE sentences USING fts5(body, tokenize='{TOKENIZER}')")


def add_rows(connection: sqlite3.Connection, first_row: int, texts: Iterable[str]) -> None:
    """The sentences `texts` as rows first_row, first_row + 1, ..."""
    connection.executemany("INSERT INTO sentences(rowid, body) VALUES (?, ?)", enumerate(texts, start=first_row))


def delete_rows(connection: sqlite3.Connection, first_row: int, rows: int) -> None:
    connection.execute("DELETE FROM sentences WHERE rowid >= ? AND rowid < ?", (first_row, first_row + rows))


class LexicalIndex:
    """BM25 over the `sentences` table of a connection (one row per sentence)."""

    def __init__(self, connection: sqlite3.Connection):
        self.connection = connection

    @classmethod
    def in_memory(cls, texts: Iterable[str]) -> "LexicalIndex":
        """The sentences `texts` as rows 0, 1, ... of a table in memory."""
        connection = sqlite3.connect(":memory:", check_same_thread=False)
        create_table(connection)
        add_rows(connection, 0, texts)
        return cls(connection)

    def search(self, text: str) -> Iterator[tuple[int, float]]:
        """The rows sharing a word with `text`, best first: (row, BM25 score), fetched as they are read."""
        expression = match_expression(text)
        if not expression:
            return
        # FTS5's bm25() is negated (lower is better, so that ORDER BY ... ASC ranks best first).
        for row, score in self.connection.execute("SELECT rowid, bm25(sentences) FROM sentences WHERE sentences "
                                                  "MATCH ? ORDER BY bm25(sentences)", (expression,)):
            yield row, -score

