"""Padding a list of feature rows into one batch of model inputs.

Rows are `Features.to_dict()` dicts (or rows of a cached feature dataset). Only the keys named in
`MODEL_INPUT_NAMES` go into the batch, so `model(**collate_features(rows, pad_id))` works; the
bookkeeping keys (offsets, sources, kinds) stay with the rows. Each input is padded to the longest
row in the batch: ids with the tokenizer's pad id, masks and token types with 0, structure ids
with -1 ("none"), `global_sees_all` with False and `global_features` with zeros.

`length_batches` groups rows of similar length, so a batch pads little.
"""

from typing import Any, Sequence

import torch

from longdoc.data.features import MODEL_INPUT_NAMES

_PAD_VALUES = {
    "long_attention_mask": 0, "global_attention_mask": 0, "long_token_type_ids": 0, "global_token_type_ids": 0,
    "sentence_ids": -1, "mention_ids": -1, "long_paragraph_ids": -1, "global_paragraph_ids": -1,
    "global_sees_all": False,
}


def collate_features(rows: Sequence[dict[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Model inputs of `rows`, padded: [B, L] / [B, G] (int64; bool for global_sees_all) and
    global_features [B, G, F] float32 when the rows have it."""
    batch = {}
    for name in MODEL_INPUT_NAMES:
        if name not in rows[0]:
            continue
        values = [torch.as_tensor(row[name]) for row in rows]
        if name == "global_features":
            values = [v.reshape(len(row["global_input_ids"]), -1).float() for v, row in zip(values, rows)]
            pad = 0.0
        elif name == "global_sees_all":
            values = [v.bool() for v in values]
            pad = False
        else:
            values = [v.long() for v in values]
            pad = pad_token_id if name in ("long_input_ids", "global_input_ids") else _PAD_VALUES[name]
        batch[name] = torch.nn.utils.rnn.pad_sequence(values, batch_first=True, padding_value=pad)
    return batch


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices of `lengths` in batches of at most `batch_size`, longest first.

    Sorting by length keeps rows of similar length together, so padding to the longest row of a
    batch wastes little; longest first makes the first batch the largest one, so running out of
    memory shows at the first step instead of hours in. Ties keep their input order (stable sort).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
