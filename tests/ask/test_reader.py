"""longdoc.ask.reader: answers merged and filtered on their final scores (hand-made logits, each
score derived in a comment), and a task of one's own that reads passages answers `ask` with no line
in longdoc/ask."""

import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from longdoc.ask.reader import Answer, Location, merge_answers, read_answers
from longdoc.data.examples import StructuredExample
from longdoc.data.features import FeatureSettings
from longdoc.data.spans import TokenSpan, token_span_to_char_span

TEXT = "Ada works in Rome. Rome is near Paris. The paris office is new."


@dataclass
class _Passage:
    start: int
    end: int
    sentences: tuple


class _Corpus:
    """One file, one passage holding all of it: what read_answers reads of a CorpusIndex."""

    def __init__(self, text: str):
        ends = [i + 1 for i, c in enumerate(text) if c == "."]
        starts = [0] + [end + 1 for end in ends[:-1]]
        self._passage = _Passage(0, len(text), tuple(zip(starts, ends)))
        self.documents = [SimpleNamespace(source=SimpleNamespace(text=text, path="notes.txt", extracted=False,
                                                                page_at=lambda offset: None))]

    def passage(self, hit):
        return self._passage

    def text(self, hit):
        return self.documents[0].source.text


def _token(features, word, occurrence=0):
    found = [i for i, ((start, end), source) in enumerate(zip(features.long_offsets, features.long_source_ids))
             if source == 0 and TEXT[start:end] == word]
    return found[occurrence]


class _Reading:
    """A task's ask part with hand-made answers: p(span answer) 0.4; spans listed in `order`."""

    def __init__(self, order, answer_probability=0.4, fixed=None):
        self.order, self.answer_probability, self.fixed = order, answer_probability, fixed

    def passages_example(self, question, documents):
        return StructuredExample(id="q", question=question, documents=list(documents)).validate()

    def feature_settings(self, config):
        return FeatureSettings(long_max_len=64, global_max_len=32, max_question_len=8)

    def window_inputs(self, example, window):
        return {**window.model_inputs(), "features": window}  # (for _Model to find the words' tokens)

    def collate(self, rows, pad_token_id):
        return rows

    def fixed_answer(self, windows):
        return (self.fixed, 0.7) if self.fixed else (None, self.answer_probability)

    def window_spans(self, window, max_answer_length, k):
        assert (max_answer_length, k) == (5, 20)
        return [(0.0, _token(window.features, word, n), _token(window.features, word, n)) for word, n in self.order]

    def char_span(self, features, first, last):
        return token_span_to_char_span(features.long_offsets, features.long_source_ids, TokenSpan(first, last))

    def sentence_probabilities(self, windows):
        return {0: 0.9, 1: 0.2, 2: 0.6}

    def support_threshold(self, model):
        return 0.5

    def max_answer_length(self, model):
        return 5


class _Model:
    """Start and end probabilities put on tokens by word: log-probabilities as logits, -inf elsewhere,
    so the reader's log-softmax gives them back. p(start): Paris .5, paris .3, Rome (its second
    occurrence) .2; p(end): Paris .5, paris .4, Rome .1."""

    config = SimpleNamespace(pad_token_id=0)
    START = {("Paris", 0): 0.5, ("paris", 0): 0.3, ("Rome", 1): 0.2}
    END = {("Paris", 0): 0.5, ("paris", 0): 0.4, ("Rome", 1): 0.1}

    def forward_rows(self, rows, collate, batch_size, progress=True, desc=""):
        (row,) = rows
        outputs = {}
        for name, probabilities in (("start_logits", self.START), ("end_logits", self.END)):
            logits = torch.full((len(row["long_input_ids"]),), -math.inf)
            for (word, occurrence), p in probabilities.items():
                logits[_token(row["features"], word, occurrence)] = math.log(p)
            outputs[name] = logits
        return [outputs]


def _answers(tokenizer, reading, min_score=0.05):
    hits = [SimpleNamespace(document=0, passage=0, score=1.0)]
    return read_answers("Where is Rome?", _Corpus(TEXT), hits, _Model(), tokenizer, reading, top_k=5,
                        min_score=min_score)


def test_occurrences_are_merged_and_filtered_on_their_final_scores(tokenizer):
    # Final scores: p(start) x p(end) x p(span answer) = Paris .5 x .5 x .4 = .1, paris .3 x .4 x .4 = .048,
    # Rome .2 x .1 x .4 = .008. "paris" (raw .12, above Paris's final .1) comes second and must not
    # replace the better occurrence; with min_score .05 Rome (raw .02) and nothing else is dropped.
    [answer] = _answers(tokenizer, _Reading([("Paris", 0), ("paris", 0), ("Rome", 1)]))
    assert answer.location.text == "Paris" and TEXT[answer.location.start:answer.location.end] == "Paris"
    assert answer.score == pytest.approx(0.1)
    # min_score filters final scores: at .009 Rome (.008) stays out, at .008 it comes in last.
    assert [a.location.text for a in _answers(tokenizer, _Reading([("Rome", 1), ("Paris", 0)]), 0.009)] == ["Paris"]
    found = _answers(tokenizer, _Reading([("Rome", 1), ("paris", 0), ("Paris", 0)]), 0.0079)
    assert [(a.location.text, round(a.score, 4)) for a in found] == [("Paris", 0.1), ("Rome", 0.008)]


def test_support_is_every_sentence_at_the_threshold_best_first_and_a_fixed_answer_has_no_place(tokenizer):
    [answer] = _answers(tokenizer, _Reading([], fixed="yes"))
    assert (answer.location.text, answer.location.file, answer.score) == ("yes", None, 0.7)
    # sentences 0 (.9) and 2 (.6) reach .5, best first; 1 (.2) does not
    assert [s.text for s in answer.support] == ["Ada works in Rome.", "The paris office is new."]


def test_merging_keeps_the_best_final_score_of_each_text_and_the_first_of_equals():
    def answer(text, score):
        return Answer(Location(text, "f", 0, len(text)), score)

    merged = merge_answers([answer("Paris", 0.1), answer(" paris", 0.3), answer("PARIS ", 0.3), answer("Lyon", 0.2),
                            answer("Nice", 0.01)], min_score=0.05)
    assert [(a.location.text, a.score) for a in merged] == [(" paris", 0.3), ("Lyon", 0.2)]
