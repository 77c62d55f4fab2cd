"""NQ window aggregation with hand-set logits on a synthetic document cut into overlapping windows:
the best span across windows, one entry per candidate or span however many windows see it,
scores made comparable by subtracting each window's [CLS] null score, short answers inside the
long answer, yes/no from the type head."""

import pytest
import torch

from longdoc.convert.pretrained import default_tokenizer
from longdoc.data.features import GlobalMarkers, build_features
from longdoc.model.config import GlobalLocalConfig
from longdoc.tasks.nq.decode import (
    WindowScores, candidate_scores, candidate_tokens, decode_example, short_span_scores,
)
from longdoc.tasks.nq.features import ANSWER_TYPES, HtmlMarkerTokenizer, feature_settings
from longdoc.tasks.nq.reader import read_examples
from longdoc.tasks.nq.synthetic import write_synthetic_nq

CONFIG = GlobalLocalConfig(long_max_len=64, global_max_len=40)
CONFIG.task_options = {"stride": 30, "max_question_len": 16, "max_short_answer_length": 8}


@pytest.fixture(scope="module")
def example_and_windows(tmp_path_factory):
    path = write_synthetic_nq(tmp_path_factory.mktemp("nq") / "synthetic.jsonl", 1, seed=11, paragraphs=6,
                              paragraph_words=10)
    (example,) = read_examples(path)
    tokenizer = default_tokenizer()
    windows = build_features(example, HtmlMarkerTokenizer(tokenizer), feature_settings(CONFIG),
                             GlobalMarkers.from_tokenizer(tokenizer))
    assert len(windows) >= 3
    return example, windows


def scores(features, long_bias: float = 0.0, type_logits=None) -> WindowScores:
    length = len(features.long_input_ids)
    return WindowScores(features, {"type_logits": torch.tensor(type_logits or [0.0, 0, 0, 0, 1]),
                                   "long_start_logits": torch.full((length,), long_bias),
                                   "long_end_logits": torch.full((length,), long_bias),
                                   "short_start_logits": torch.zeros(length), "short_end_logits": torch.zeros(length)})


def shared_candidate(example, windows):
    """A candidate held whole by two windows, and those windows' indices."""
    for paragraph in range(len(example.documents[0].paragraphs)):
        holders = [w for w, f in enumerate(windows) if candidate_tokens(example, f).get(paragraph, (0, -1))[1] >= 0]
        if len(holders) >= 2:
            return paragraph, holders[:2]
    raise AssertionError("no candidate lies whole in two windows")


def test_same_candidate_in_two_windows_counts_once_with_its_best_score(example_and_windows):
    example, windows = example_and_windows
    paragraph, (a, b) = shared_candidate(example, windows)
    window_scores = [scores(f) for f in windows]
    for w, value in ((a, 2.0), (b, 4.0)):
        _, first, last = candidate_tokens(example, windows[w])[paragraph]
        window_scores[w].outputs["long_start_logits"][first] = value / 2
        window_scores[w].outputs["long_end_logits"][last] = value / 2
    found = candidate_scores(example, window_scores)
    assert found[paragraph] == (4.0, b)
    assert sum(1 for p in found if p == paragraph) == 1
    record = decode_example(example, window_scores, 8)
    top_level = example.labels["top_level_candidates"][paragraph]
    candidate = example.labels["long_answer_candidates"][top_level]
    assert (record["long_answer"]["start_token"], record["long_answer"]["end_token"]) == (
        candidate["start_token"], candidate["end_token"])
    assert record["long_answer_score"] == 4.0


def test_best_span_across_windows_after_subtracting_each_windows_null(example_and_windows):
    example, windows = example_and_windows
    first_window, last_window = windows[0], windows[-1]
    p = next(p for p, (_, f, _) in candidate_tokens(example, first_window).items() if f >= 0)
    q = next(q for q, (_, f, _) in candidate_tokens(example, last_window).items()
             if f >= 0 and q not in candidate_tokens(example, first_window))
    # Window 0's logits are all 10 higher (its [CLS] too): raw, its candidate would win 21 to 2.
    window_scores = [scores(f, long_bias=10.0 if w == 0 else 0.0) for w, f in enumerate(windows)]
    _, first, last = candidate_tokens(example, first_window)[p]
    window_scores[0].outputs["long_start_logits"][first] += 1.0
    _, first, last = candidate_tokens(example, last_window)[q]
    window_scores[-1].outputs["long_start_logits"][first] += 2.0
    found = candidate_scores(example, window_scores)
    assert found[p] == (1.0, 0) and found[q] == (2.0, len(windows) - 1)
    record = decode_example(example, window_scores, 8)
    candidate = example.labels["long_answer_candidates"][example.labels["top_level_candidates"][q]]
    assert record["long_answer"]["start_token"] == candidate["start_token"]
    assert record["long_answer_score"] == 2.0


def test_short_answer_lies_inside_the_long_answer_and_is_counted_once(example_and_windows):
    example, windows = example_and_windows
    paragraph, (a, b) = shared_candidate(example, windows)
    window_scores = [scores(f) for f in windows]
    for w in (a, b):
        _, first, last = candidate_tokens(example, windows[w])[paragraph]
        window_scores[w].outputs["long_start_logits"][first] = window_scores[w].outputs["long_end_logits"][last] = 5.0
        # The best short logits of the window lie outside the candidate: they must be ignored.
        window_scores[w].outputs["short_start_logits"][:] = 9.0
        window_scores[w].outputs["short_start_logits"][first:last + 1] = 0.0
        window_scores[w].outputs["short_end_logits"][:] = 9.0
        window_scores[w].outputs["short_end_logits"][first:last + 1] = 0.0
        # Inside: the same span (wordpieces first+1 .. first+2) in both windows, 3 then 1 above null.
        window_scores[w].outputs["short_start_logits"][first + 1] = 2.0 if w == a else 1.0
        window_scores[w].outputs["short_end_logits"][first + 2] = 1.0 if w == a else 0.0
        window_scores[w].outputs["short_start_logits"][0] = window_scores[w].outputs["short_end_logits"][0] = 0.0
    spans = short_span_scores(example, window_scores, paragraph, 8)
    best = max(spans.items(), key=lambda item: item[1])
    assert best[1] == 3.0 and list(spans.values()).count(3.0) == 1
    record = decode_example(example, window_scores, 8)
    (short,) = record["short_answers"]
    long_answer = record["long_answer"]
    assert long_answer["start_token"] <= short["start_token"] < short["end_token"] <= long_answer["end_token"]
    assert (short["start_token"], short["end_token"]) == best[0] and record["short_answers_score"] == 3.0
    assert record["yes_no_answer"] == "NONE"


def test_yes_no_comes_from_the_type_head_of_the_best_window(example_and_windows):
    example, windows = example_and_windows
    yes = [0.0] * len(ANSWER_TYPES)
    yes[ANSWER_TYPES.index("yes")] = 3.0
    window_scores = [scores(f, type_logits=yes) for f in windows]
    record = decode_example(example, window_scores, 8)
    assert record["yes_no_answer"] == "YES" and record["short_answers"] == []
    assert record["short_answers_score"] == record["long_answer_score"]
