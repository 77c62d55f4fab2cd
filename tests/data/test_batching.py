"""Batching: length-sorted batches."""

import pytest

from longdoc.data.batching import length_batches


def test_length_batches_longest_first_and_each_index_once():
    lengths = [5, 9, 1, 9, 7, 3, 2]
    batches = length_batches(lengths, batch_size=3)
    # Sorted longest first, ties in input order (1 before 3), the last batch takes the rest.
    assert batches == [[1, 3, 4], [0, 5, 6], [2]]
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))


def test_length_batches_edge_cases():
    assert length_batches([], batch_size=4) == []
    assert length_batches([3, 4], batch_size=8) == [[1, 0]]
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        length_batches([1], batch_size=0)
