"""The window policy: hand-computed plans, coverage and limits, and a real over-length document."""

import pytest

from longdoc.data.features import FeatureSettings, build_features
from longdoc.convert.pretrained import default_tokenizer
from longdoc.tasks.nq.reader import read_examples
from longdoc.data.windows import Window, plan_windows


def test_plan_by_hand():
    # 10 tokens, windows of 4 overlapping by 1: starts 0, 3, 6 (step 4 - 1 = 3); the last ends at 10.
    assert plan_windows(10, 4, 1) == [Window(0, 4), Window(3, 7), Window(6, 10)]
    # No overlap: 0-4, 4-8, 8-10.
    assert plan_windows(10, 4, 0) == [Window(0, 4), Window(4, 8), Window(8, 10)]
    assert plan_windows(3, 4, 1) == [Window(0, 3)]
    assert plan_windows(0, 4, 1) == [Window(0, 0)]


def test_forbidden_cuts_move_edges_back():
    # Cuts before tokens 3 and 4 are forbidden: the first window (0..4) ends back at 2; the next
    # starts stride 1 back at 1 and ends at 1 + 4 = 5 (allowed); the next would start at 5 - 1 = 4,
    # forbidden, then 3, forbidden, so at 2, and ends at 6, the last token.
    allowed = lambda position: position not in (3, 4)
    assert plan_windows(6, 4, 1, allowed) == [Window(0, 2), Window(1, 5), Window(2, 6)]


@pytest.mark.parametrize("num_tokens", [1, 7, 50, 101])
@pytest.mark.parametrize("window_len,stride", [(1, 0), (5, 0), (5, 2), (8, 7), (16, 3)])
def test_every_token_covered_and_limits_held(num_tokens, window_len, stride):
    windows = plan_windows(num_tokens, window_len, stride)
    covered = set()
    for previous, window in zip([None] + windows, windows):
        assert 0 < window.end - window.start <= window_len
        covered.update(range(window.start, window.end))
        if previous is not None:
            assert previous.end - window.start >= stride  # overlap at least stride
            assert window.start > previous.start  # always progresses
    assert covered == set(range(num_tokens))


@pytest.mark.parametrize("window_len,stride,message", [
    (0, 0, r"window length must be >= 1, got 0"),
    (4, 4, r"stride must be in \[0, window length 4\), got 4"),
    (4, -1, r"stride must be in \[0, window length 4\), got -1"),
])
def test_bad_arguments(window_len, stride, message):
    with pytest.raises(ValueError, match=message):
        plan_windows(10, window_len, stride)


def test_real_long_document_windows(shared_data):
    """NQ's second sample (a long Wikipedia page) with long_max_len 256: every document token is in
    some window, and every window keeps both length limits."""
    tokenizer = default_tokenizer()
    example = list(read_examples(shared_data / "natural_questions" / "simplified-nq-train.sample2.jsonl"))[1]
    settings = FeatureSettings(long_max_len=256, global_max_len=48, stride=64, max_question_len=32)
    features = build_features(example, tokenizer, settings)
    total = features[-1].window_end
    # a real over-length document: about 5,600 wordpieces, so more than 20 windows of at most 221
    assert total > 5_000 and len(features) > 20
    covered = set()
    for window in features:
        assert len(window.long_input_ids) <= 256 and len(window.global_input_ids) <= 48
        # the document tokens of the window sit between the question prefix and the final [SEP]
        document_tokens = [s for s in window.long_source_ids if s >= 0]
        assert len(document_tokens) == window.window_end - window.window_start
        covered.update(range(window.window_start, window.window_end))
    assert covered == set(range(total))
