"""The BM25 index (SQLite FTS5): queries that are never FTS5 syntax, the ranking of a named fact among
same-relation facts, and rows replaced as a changed document's are."""

import sqlite3

from longdoc.ask import lexical
from longdoc.ask.lexical import LexicalIndex, query_words

SENTENCES = ["Mara Quell visited Ortorhaven in 1978.", "Ivo Brand was born in Tallinnford.",
             "Mara Quell wrote a letter to Ivo Brand.", "Mara Quell was born in Zelrohaven.",
             "Lena Vorn was born in Mariwick.", "Zoë Lind was born in Québec.",
             # others, so that names are rare words, as in a document
             *(f"{name} sold a boat in {year}." for name, year in zip(
                 ("Ada Fenn", "Bo Kael", "Cy Ulm", "Dag Orr", "Eli Sand", "Fay Toll", "Gus Wren", "Hal Ives"),
                 range(1901, 1909)))]


def test_a_query_is_the_distinct_words_quoted_so_no_question_is_fts5_syntax():
    assert query_words('Who is "Mara" AND mara NEAR (x*)?') == ['"who"', '"mara"', '"near"', '"x"']
    assert query_words("?! -- ...") == [] and query_words("Is it the one?") == ['"one"']
    assert query_words("Is it?") == []  # stop words only
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


def test_rows_deleted_and_added_score_as_a_table_built_fresh_with_the_rows_left():
    # A changed document's rows are deleted and its new ones added at other row numbers: BM25's word
    # statistics must then be those of the rows the table holds, as if it had been built with them.
    updated = sqlite3.connect(":memory:")
    lexical.create_table(updated)
    lexical.add_rows(updated, 0, SENTENCES[:7])
    lexical.add_rows(updated, 7, ["Mara Quell was born in Mariwick and in Ortorhaven.", "Born, born, born."])
    lexical.add_rows(updated, 9, SENTENCES[7:])
    lexical.delete_rows(updated, 7, 2)
    fresh = LexicalIndex.in_memory(SENTENCES)
    for question in ("Where was Mara Quell born?", "Who sold a boat in 1903?", "born Mariwick"):
        found = [(row if row < 7 else row - 2, score) for row, score in LexicalIndex(updated).search(question)]
        assert found == list(fresh.search(question))
