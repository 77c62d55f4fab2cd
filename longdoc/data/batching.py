"""Padding a list of feature rows into one batch, by the input schema of `longdoc.model.inputs`.

Rows are `Features.to_dict()` dicts (or rows of a cached feature dataset), plus whatever labels a
task adds. `collate_features` batches the keys named by `ENCODER_INPUTS` and by the `extra` specs a
task passes for its labels, padding each by its spec (the rules are in `longdoc.model.inputs`), so
`model(**collate_features(rows, pad_id))` works; bookkeeping keys (offsets, sources, kinds) stay
with the rows.
"""

from typing import Any, Sequence

import torch

from longdoc.model.inputs import ENCODER_INPUTS, InputSpec


def collate_features(
    rows: Sequence[dict[str, Any]], pad_token_id: int, extra: Sequence[InputSpec] = ()
) -> dict[str, torch.Tensor]:
    """The encoder inputs and `extra` specs in `rows`, each padded to the batch's longest row along
    every named axis: [B, L] / [B, G] int64 (bool for global_sees_all), global_features [B, G, F]
    float32 when the rows have it, extras by their specs. ValueError naming the row and field when
    a row's value has the wrong depth, disagrees with the other fields on an axis, or is missing."""
    if not rows:
        raise ValueError("collate_features needs at least one row")
    specs = [spec for spec in (*ENCODER_INPUTS, *extra) if rows[0].get(spec.name) is not None]
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"extra specs repeat a name: {names}")
    values = {spec.name: [_row_tensor(spec, row, index) for index, row in enumerate(rows)] for spec in specs}
    # Per row, the size of each named axis, taken from the first field that has it.
    axis_sizes: list[dict[str, tuple[int, str]]] = [{} for _ in rows]
    for spec in specs:
        for index, tensor in enumerate(values[spec.name]):
            for axis, size in zip(spec.axes[1:], tensor.shape):
                if isinstance(axis, int):
                    if size != axis:
                        raise ValueError(f"row {index}: {spec.name} has {size} values along an axis of fixed size {axis}")
                    continue
                known = axis_sizes[index].setdefault(axis, (size, spec.name))
                if known[0] != size:
                    raise ValueError(
                        f"row {index}: {spec.name} has {size} values along {axis!r}, but {known[1]} has {known[0]}"
                    )
    batch = {}
    for spec in specs:
        shape = [len(rows)] + [
            axis if isinstance(axis, int) else max(sizes[axis][0] for sizes in axis_sizes) for axis in spec.axes[1:]
        ]
        padded = torch.full(shape, spec.pad_value(pad_token_id), dtype=spec.dtype)
        for index, tensor in enumerate(values[spec.name]):
            padded[(index, *(slice(0, size) for size in tensor.shape))] = tensor
        batch[spec.name] = padded
    return batch


def _row_tensor(spec: InputSpec, row: dict[str, Any], index: int) -> torch.Tensor:
    value = row.get(spec.name)
    if value is None:
        raise ValueError(f"row {index} has no {spec.name} (row 0 has it)")
    tensor = torch.as_tensor(value, dtype=spec.dtype)
    if tensor.dim() != len(spec.axes) - 1:
        raise ValueError(
            f"row {index}: {spec.name} has shape {tuple(tensor.shape)}, expected {len(spec.axes) - 1} axes "
            f"({', '.join(map(str, spec.axes[1:])) or 'a single value'})"
        )
    return tensor

