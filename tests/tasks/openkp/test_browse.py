"""The OpenKP page of the prediction browser (longdoc.tasks.openkp.browse) on hand-made files: where
the model ranked a gold phrase it did not write, read from the scores side file."""

import json

from longdoc.data.prediction_scores import write_scores
from longdoc.tasks.openkp.browse import open_browser

URL = "http://example.org/clinic"
WRITTEN = [["opening", "hours"], ["the", "clinic"], ["book"], ["visit"], ["doctor"]]


def test_a_gold_phrase_the_model_ranked_below_the_written_ones_shows_its_rank(tmp_path):
    gold = tmp_path / "gold.jsonl"
    gold.write_text(json.dumps({"url": URL, "KeyPhrases": [["Doctor"], ["web", "application"]],
                                "text": "Book a visit with the doctor through our web application"}) + "\n")
    pred = tmp_path / "pred.jsonl"
    pred.write_text(json.dumps({"url": URL, "KeyPhrases": WRITTEN}) + "\n")
    scored = WRITTEN + [["a", "visit"], ["Web", "Application"]]  # the model's 6th and 7th
    write_scores(pred, [{"id": URL, "keyphrases": [{"phrase": phrase, "score": 1.0 - rank / 10}
                                                   for rank, phrase in enumerate(scored)]}])
    (table,) = open_browser(gold, [pred]).view(URL).tables
    assert table.columns == ("keyphrase", "gold", "run 1 rank", "run 1 model's rank of 7", "run 1 score")
    rows = {row[0]: row[1:] for row in table.rows}
    assert rows["doctor"] == ("gold", "5", "5", "0.6")  # written fifth
    assert rows["web application"] == ("gold", "", "7", "0.4")  # not written: the model's seventh
    assert rows["opening hours"] == ("", "1", "1", "1")
    assert "a visit" not in rows  # neither gold nor written: not a row


def test_without_a_side_file_the_page_has_the_files_ranks_only(tmp_path):
    gold = tmp_path / "gold.jsonl"
    gold.write_text(json.dumps({"url": URL, "KeyPhrases": [["doctor"]]}) + "\n")
    pred = tmp_path / "pred.jsonl"
    pred.write_text(json.dumps({"url": URL, "KeyPhrases": WRITTEN}) + "\n")
    (table,) = open_browser(gold, [pred]).view(URL).tables
    assert table.columns == ("keyphrase", "gold", "run 1 rank")
