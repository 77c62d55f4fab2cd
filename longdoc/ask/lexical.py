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

A query scores only the rows that can rank (`Query.needed_above`): each word adds less than its
IDF times (k1 + 1) to a row's score, whatever its frequency and the row's length, so that a row
holding only common words ("film", "first", "which": a tenth of a large corpus's rows each, and
most of the rows a question's words match) scores below a known bound, and a ranking whose k-th
place scores above it need not score them: FTS5 computes bm25() for every row it returns (a few
microseconds each; 100,000 rows at 10,000 documents), where going through the rows that match
costs a tenth of that.

The rows of a whole corpus live in one table of its index file (`longdoc.ask.index`), numbered by
that file: `add_rows` and `delete_rows` change them inside the caller's transaction. The table keeps
the sentences' text (SQLite's FTS5 deletes a row of a table without its content only from 3.43 on),
so a changed document's rows are replaced without its old text, and BM25's word statistics are
always those of the documents indexed.
"""

import math
import re
import sqlite3
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

TOKENIZER = "porter unicode61 remove_diacritics 2"
LEXICAL_FORMAT = 2  # bump when the table or its tokenizer change: cached indexes are keyed by it
_WORD = re.compile(r"\w+")
STOP_WORDS = frozenset("a an and are as at be but by for if in into is it no not of on or such that the their then "
                       "there these they this to was will with".split())


K1 = 1.2  # FTS5's bm25() k1 (a constant of its source; its documentation's value)


def query_words(text: str) -> list[str]:
    """`text`'s distinct words but STOP_WORDS, each an FTS5 string (quoted)."""
    words = dict.fromkeys(word for word in map(str.lower, _WORD.findall(text)) if word not in STOP_WORDS)
    return ['"' + word.replace('"', '""') + '"' for word in words]


@dataclass(frozen=True)
class Query:
    """The words of a text as `LexicalIndex.rank` scores them: each word's rows (how many hold it)
    and its IDF as FTS5's bm25() computes it."""

    words: tuple[str, ...]  # FTS5 strings (query_words)
    rows: tuple[int, ...]
    idf: tuple[float, ...]

    def rarest(self, rows: int) -> tuple[str, ...] | None:
        """The words fewest rows hold, about `rows` rows together (one word at least), in the query's
        order; None when that is every word."""
        chosen, total = set(), 0
        for i in sorted(range(len(self.words)), key=lambda i: self.rows[i]):
            if chosen and total + self.rows[i] > rows:
                break
            chosen.add(i)
            total += self.rows[i]
        return None if len(chosen) == len(self.words) else tuple(w for i, w in enumerate(self.words) if i in chosen)

    def needed_above(self, score: float) -> tuple[str, ...] | None:
        """Words of which a row must hold one to score `score` or more: all but the most common words
        whose IDFs times (k1 + 1), a bound on what each adds, stay below it together; None when all."""
        common, bound = set(), 0.0
        for i in sorted(range(len(self.words)), key=lambda i: -self.rows[i]):
            added = self.idf[i] * (K1 + 1)
            if (bound + added) * (1 + 1e-9) >= score:  # the margin: the sum's rounding in FTS5's order
                break
            common.add(i)
            bound += added
        return tuple(w for i, w in enumerate(self.words) if i not in common) if common else None


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
        """`connection`: holds the table; its rows do not change while this object is used (a
        snapshot, or no writer): their count is read once."""
        self.connection = connection
        self._row_count: int | None = None

    @classmethod
    def in_memory(cls, texts: Iterable[str]) -> "LexicalIndex":
        """The sentences `texts` as rows 0, 1, ... of a table in memory."""
        connection = sqlite3.connect(":memory:", check_same_thread=False)
        create_table(connection)
        add_rows(connection, 0, texts)
        return cls(connection)

    def query(self, text: str) -> Query:
        """`text`'s words, with how many rows hold each and its IDF."""
        if self._row_count is None:
            # FTS5 keeps one docsize row per row: the count its bm25() reads from its own record.
            [[self._row_count]] = self.connection.execute("SELECT COUNT(*) FROM sentences_docsize")
        words = query_words(text)
        rows = [self.connection.execute("SELECT COUNT(*) FROM sentences WHERE sentences MATCH ?", (word,)).fetchone()[0]
                for word in words]
        # FTS5's IDF, as its bm25() computes it (ln, and a floor for words most rows hold).
        idf = [max(math.log((self._row_count - held + 0.5) / (held + 0.5)), 1e-6) for held in rows]
        return Query(tuple(words), tuple(rows), tuple(idf))

    def search(self, text: str) -> Iterator[tuple[int, float]]:
        """The rows sharing a word with `text`, best first: (row, BM25 score), fetched as they are read."""
        return self.rank(query_words(text))

    def rank(self, words: Sequence[str], within: Sequence[str] | None = None) -> Iterator[tuple[int, float]]:
        """The rows holding one of `words` (FTS5 strings, `query_words`), best first: (row, BM25 score
        over these words), fetched as they are read; `within`: only the rows holding one of these."""
        if not words:
            return
        expression = " OR ".join(words)
        # FTS5's bm25() is negated (lower is better, so that ORDER BY ... ASC ranks best first). The
        # unary + keeps the row filter out of FTS5's own lookup (a search a row, where SQLite goes
        # through the matches once).
        filtered = "" if within is None else "AND +rowid IN (SELECT rowid FROM sentences WHERE sentences MATCH ?) "
        arguments = (expression,) if within is None else (expression, " OR ".join(within))
        for row, score in self.connection.execute(f"SELECT rowid, bm25(sentences) FROM sentences WHERE sentences "
                                                  f"MATCH ? {filtered}ORDER BY bm25(sentences)", arguments):
            yield row, -score

