"""The BM25 index (SQLite FTS5): queries that are never FTS5 syntax, the ranking of a named fact among
same-relation facts, and files written whole or not at all."""

import sqlite3

import pytest

from longdoc.ask import lexical
from longdoc.ask.lexical import LexicalIndex, match_expression, write_lexical_index

SENTENCES = ["Mara Quell visited Ortorhaven in 1978.", "Ivo Brand was born in Tallinnford.",
             "Mara Quell wrote a letter to Ivo Brand.", "Mara Quell was born in Zelrohaven.",
             "Lena Vorn was born in Mariwick.", "Zoë Lind was born in Québec.",
             # others, so that names are rare words, as in a document
             *(f"{name} sold a boat in {year}." for name, year in zip(
                 ("Ada Fenn", "Bo Kael", "Cy Ulm", "Dag Orr", "Eli Sand", "Fay Toll", "Gus Wren", "Hal Ives"),
                 range(1901, 1909)))]


def test_a_query_is_the_distinct_words_quoted_so_no_question_is_fts5_syntax():
    assert match_expression('Who is "Mara" AND mara NEAR (x*)?') == '"who" OR "mara" OR "near" OR "x"'
    assert match_expression("?! -- ...") == "" and match_expression("Is it the one?") == '"one"'
    assert match_expression("Is it?") == ""  # stop words only
    index = LexicalIndex.in_memory(SENTENCES)
    for question in ('Where was "Mara Quell" born?', "NEAR(born was)", "born*", "-born", "Mara: born?", "1978 OR 1=1"):
        assert list(index.search(question))  # no FTS5 syntax error, and a match
    for question in ("?!", "qwzx vbnm", "' OR 1=1 --"):  # no word the sentences hold: nothing, no error
        assert list(index.search(question)) == []


def test_the_sentence_naming_the_person_with_the_relation_ranks_first():
    index = LexicalIndex.in_memory(SENTENCES)
    ranked = list(index.search("Where was Mara Quell born?"))
    assert ranked[0][0] == 3 and ranked[0][1] > 1.2 * ranked[1][1]  # name and relation together, then either
    assert [score for _, score in ranked] == sorted((score for _, score in ranked), reverse=True)
    assert next(index.search("Zoe Lind quebec"))[0] == 5  # case and diacritics folded
    assert next(index.search("Where does Ivo Brand's birth city lie? Born"))[0] == 1
    # "the" and "of" are rare in these sentences: were they kept, they would outweigh "born".
    with_the = LexicalIndex.in_memory([*SENTENCES, "Mara Quell painted the old bridge of Ortorhaven."])
    assert next(with_the.search("What is the place of birth of Mara Quell? She was born"))[0] == 3


def test_an_index_file_is_written_whole_and_read_back(tmp_path):
    path = tmp_path / "cache" / "lexical.sqlite"
    write_lexical_index(path, SENTENCES)
    index = LexicalIndex.open(path, len(SENTENCES))
    assert next(index.search("Lena Vorn"))[0] == 4
    assert [p.name for p in path.parent.iterdir()] == ["lexical.sqlite"]
    with pytest.raises(ValueError, match="has 14 sentences, the document 5"):
        LexicalIndex.open(path, 5)
    path.write_bytes(b"not a database at all" * 100)
    with pytest.raises(ValueError, match="not a lexical index"):
        LexicalIndex.open(path, len(SENTENCES))


def test_a_write_that_fails_leaves_neither_the_file_nor_a_temporary(tmp_path, monkeypatch):
    def failing(connection, texts):
        connection.execute("CREATE TABLE half (x)")
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(lexical, "_create", failing)
    path = tmp_path / "lexical.sqlite"
    with pytest.raises(sqlite3.OperationalError, match="disk is full"):
        write_lexical_index(path, SENTENCES)
    assert list(tmp_path.iterdir()) == []
