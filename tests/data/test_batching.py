"""Batching: length-sorted batches; collating inputs and labels by the input schema."""

import pytest
import torch

from longdoc.data.batching import collate_features
from longdoc.model.inputs import InputSpec
from longdoc.model.task_model import length_batches


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


def two_rows() -> list[dict]:
    # Row 0: 3 long tokens, 2 globals; row 1: 2 long tokens, 1 global.
    return [
        {"long_input_ids": [5, 6, 7], "long_attention_mask": [1, 1, 1], "sentence_ids": [0, 1, 1],
         "global_input_ids": [2, 3], "global_sees_all": [True, False], "global_features": [[1.0, 2.0], [3.0, 4.0]],
         "answer_start": 2, "supporting": [1, 0], "spans": [[0, 1], [2, 2]], "offsets": "not a model input"},
        {"long_input_ids": [8, 9], "long_attention_mask": [1, 1], "sentence_ids": [0, 0],
         "global_input_ids": [4], "global_sees_all": [True], "global_features": [[5.0, 6.0]],
         "answer_start": 0, "supporting": [1], "spans": [[1, 1]], "offsets": "not a model input"},
    ]


LABELS = (
    InputSpec("answer_start", ("batch",), torch.long, pad=-100),
    InputSpec("supporting", ("batch", "global"), torch.float32, pad=-100.0),
    InputSpec("spans", ("batch", "answer", 2), torch.long, pad=-1),
)


def test_collate_pads_each_input_and_label_by_its_spec():
    batch = collate_features(two_rows(), pad_token_id=0, extra=LABELS)
    assert list(batch) == ["long_input_ids", "global_input_ids", "long_attention_mask", "sentence_ids",
                           "global_sees_all", "global_features", "answer_start", "supporting", "spans"]
    assert batch["long_input_ids"].tolist() == [[5, 6, 7], [8, 9, 0]]
    assert batch["sentence_ids"].tolist() == [[0, 1, 1], [0, 0, -1]]
    assert batch["global_sees_all"].tolist() == [[True, False], [True, False]]
    assert batch["global_features"].dtype == torch.float32
    assert batch["global_features"].tolist() == [[[1, 2], [3, 4]], [[5, 6], [0, 0]]]
    assert batch["answer_start"].tolist() == [2, 0]
    # A "global" label pads to the same G as the global inputs, so it lines up with them.
    assert batch["supporting"].tolist() == [[1.0, 0.0], [1.0, -100.0]]
    assert batch["spans"].tolist() == [[[0, 1], [2, 2]], [[1, 1], [-1, -1]]]
    pad_id = collate_features(two_rows(), pad_token_id=3)["global_input_ids"]
    assert pad_id.tolist() == [[2, 3], [4, 3]]


def test_collate_leaves_out_absent_fields_and_refuses_disagreeing_rows():
    rows = two_rows()
    for row in rows:
        del row["global_features"]
    assert "global_features" not in collate_features(rows, 0)
    rows = two_rows()
    rows[1]["sentence_ids"] = [0, 0, 0]
    with pytest.raises(ValueError, match=r"row 1: sentence_ids has 3 values along 'long', but long_input_ids has 2"):
        collate_features(rows, 0)
    rows = two_rows()
    rows[0]["supporting"] = [1, 0, 0]
    with pytest.raises(ValueError, match=r"row 0: supporting has 3 values along 'global', but global_input_ids has 2"):
        collate_features(rows, 0, extra=LABELS)
    rows = two_rows()
    rows[1]["global_features"] = [5.0, 6.0]
    with pytest.raises(ValueError, match=r"row 1: global_features has shape \(2,\), expected 2 axes \(global, feature\)"):
        collate_features(rows, 0)
    rows = two_rows()
    rows[1]["spans"] = [[1, 1, 1]]
    with pytest.raises(ValueError, match="row 1: spans has 3 values along an axis of fixed size 2"):
        collate_features(rows, 0, extra=LABELS)
    rows = two_rows()
    del rows[1]["answer_start"]
    with pytest.raises(ValueError, match=r"row 1 has no answer_start \(row 0 has it\)"):
        collate_features(rows, 0, extra=LABELS)
    with pytest.raises(ValueError, match="extra specs repeat a name"):
        collate_features(two_rows(), 0, extra=(InputSpec("sentence_ids", ("batch", "long"), torch.long),))
