"""scripts/bench_haystack.py (benchmarks.haystack): the corpus of paragraph files, the answers' figures on
known pairs, and each side measured small; the Haystack side where haystack-ai is installed."""

import json
import sys

import pytest

from benchmarks.haystack import (TABLE_COLUMNS, Corpus, GoldQuestion, answer_figures, haystack_contender,
                                 haystack_versions, longdoc_contender, measure, side_by_side, write_paragraph_files)

SAMPLE = "hotpotqa/hotpot_dev_distractor_v1.first53.json"


def test_the_sample_makes_one_file_per_title_and_each_question_names_its_supporting_files(shared_data, tmp_path):
    corpus = write_paragraph_files(shared_data / SAMPLE, tmp_path)
    assert (len(corpus.files), len(corpus.questions)) == (521, 53)  # 522 paragraphs, one title twice
    examples = json.loads((shared_data / SAMPLE).read_text(encoding="utf-8"))
    title, sentences = examples[0]["context"][0]
    assert (tmp_path / "0001.txt").read_text(encoding="utf-8") == title + "\n" + "".join(sentences) + "\n"
    first = corpus.questions[0]
    assert (first.question, first.answer) == ("Were Scott Derrickson and Ed Wood of the same nationality?", "yes")
    assert {(tmp_path / name).read_text(encoding="utf-8").split("\n")[0] for name in first.supporting_files} == {
        "Scott Derrickson", "Ed Wood"}


def test_answer_figures_score_the_first_answer_with_the_official_rules_and_count_retrieval_hits(tmp_path):
    corpus = Corpus(tmp_path, ("a.txt", "b.txt", "c.txt"), (
        GoldQuestion("Which office?", "Chief of Protocol", frozenset({"a.txt", "b.txt"})),
        GoldQuestion("Same nationality?", "yes", frozenset({"c.txt"}))))
    results = [
        {"answers": [{"text": "Chief of Protocol of the United States"}, {"text": "Chief of Protocol"}],
         "passages": [{"file": str(tmp_path / "a.txt")}, {"file": str(tmp_path / "c.txt")}]},
        {"answers": [{"text": "no"}], "passages": [{"file": "c.txt"}]},
    ]
    figures = answer_figures(corpus, results)
    # "chief of protocol of united states" against "chief of protocol": 3 tokens shared of 6 and 3, so
    # F1 2 * 0.5 * 1 / 1.5 = 2/3; "no" against "yes": no partial credit. Only the first answer counts.
    assert figures["em"] == 0.0
    assert figures["f1"] == pytest.approx((2 / 3 + 0) / 2)
    assert figures["holds_gold"] == 0.5
    assert (figures["retrieval_one"], figures["retrieval_all"], figures["passages_read"]) == (1.0, 0.5, 1.5)


@pytest.fixture
def small_corpus(shared_data, tmp_path) -> Corpus:
    """The paragraphs of the sample's first two questions: 20 files."""
    return write_paragraph_files(shared_data / SAMPLE, tmp_path / "paragraphs", records=2)


def check_row(row: dict) -> None:
    assert row["questions"] == 2 and len(row["answers"]) == 2
    assert row["index_s"] > 0 and row["first_question_s"] > 0 and row["per_question_s"] > 0
    table = side_by_side([row]).splitlines()
    assert [cell.strip() for cell in table[0].split("|")[1:-1]] == list(TABLE_COLUMNS)
    assert [cell.strip() for cell in table[2].split("|")[1:-1]] == [str(row[column]) for column in TABLE_COLUMNS]


@pytest.mark.slow
def test_the_longdoc_side_runs_the_command_and_reads_both_gold_paragraphs(small_corpus, tmp_path):
    row = measure(longdoc_contender("longdoc ask (sentence mode)", small_corpus, tmp_path), small_corpus, first_runs=1)
    check_row(row)
    # 20 short files: ask reads every gold supporting paragraph of both questions
    assert (row["retrieval_one"], row["retrieval_all"]) == (1.0, 1.0)
    # sentence mode answers with a sentence: for the first question, Ed Wood's first (after his title line)
    assert row["answers"][0].startswith("Ed Wood\nEdward Davis Wood Jr.")
    assert (row["em"], row["f1"]) == (0.0, 0.0)


@pytest.mark.slow
def test_the_haystack_side_reads_as_many_documents_as_ask_reads_at_least(small_corpus, tmp_path):
    if haystack_versions(sys.executable) is None:
        pytest.skip("haystack-ai is not installed in this Python: the benchmark's peer, which the project does "
                    "not depend on")
    from longdoc.convert.pretrained import minilm_path

    contender = haystack_contender("Haystack (retrieval, best document)", sys.executable, tmp_path, small_corpus,
                                   minilm_path())
    row = measure(contender, small_corpus, first_runs=1)
    check_row(row)
    assert row["passages_read"] == 8.0
    assert row["retrieval_one"] == 1.0
    assert row["answers"][0].startswith("Ed Wood\n")  # the best document is Ed Wood's paragraph
