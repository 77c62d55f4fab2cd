"""The export's check of itself: the ONNX graph against the PyTorch model at lengths it was not traced at.

Peers' exports gave wrong outputs when the runtime length differed from the traced one
(huggingface/optimum#505, transformers#20292) or traced a count of blocks as a constant
(transformers#20275). Before anything is written, the graph runs in ONNX Runtime beside the model
(eager attention, the specification the export traced) on random batches with padding in the
batch, at `check_lengths(config)` long tokens (at least three, none the traced one: one shorter
than a block, one not a multiple of the block, the longest the model takes, and one over 4096
where the model takes more), with global tokens and, for an encoder's graph, without any;
each output's largest difference over the real tokens is recorded (a padded position's output is
none: a query that may attend to nothing averages whatever keys its block has), and one over
`TOLERANCE` refuses the export (`ExportMismatch`: which output, length and global count, how much).
"""

from dataclasses import dataclass

import numpy as np
import torch

from longdoc.errors import InputError
from longdoc.export.graph import traced_length
from longdoc.export.signature import KIND_ENCODER, GraphSignature, PositionalGraph, sample_batch

# Largest difference allowed between an output of the graph and the model's, relative to the
# output's own size where that is over 1 (float32 on both sides).
TOLERANCE = 1e-4
LONG_CHECK = 4096  # the length ETC's tasks read: a length over it is checked where the model takes one
CHECK_GLOBALS = 5


class ExportMismatch(InputError):
    """The graph's outputs differ from the model's: nothing was written."""


@dataclass(frozen=True)
class LengthCheck:
    """One checked batch: its long length and global tokens, and per output the largest difference."""

    length: int
    num_globals: int
    batch: int
    max_difference: dict[str, float]

    def to_json(self) -> dict:
        return {"length": self.length, "global_tokens": self.num_globals, "batch": self.batch,
                "max_difference": {name: float(f"{value:.3g}") for name, value in self.max_difference.items()}}


def check_lengths(config) -> list[int]:
    """The long lengths checked (see the module docstring), shortest first."""
    block, longest = config.local_radius + 1, config.long_max_len
    lengths = {max(2, block // 2 + 1), min(longest, 3 * block + block // 3 + 1), longest}
    if longest > LONG_CHECK:
        lengths.add(LONG_CHECK + block // 2 + 1 if LONG_CHECK + block // 2 + 1 < longest else longest - 1)
    lengths.discard(traced_length(config))
    while len(lengths) < 3:  # (a model whose longest input is a few blocks)
        lengths.add(max(lengths) - 1)
    return sorted(lengths)


def compare(model: torch.nn.Module, session, signature: GraphSignature, *, lengths=None,
            progress=None) -> list[LengthCheck]:
    """Run the graph (`session`, an onnxruntime.InferenceSession) and the model on the same batches;
    ExportMismatch at the first output that differs by more than TOLERANCE. `progress(text)` is told
    each batch before it runs."""
    config = model.config
    model.eval()
    model.set_attention_backend("eager")
    flat = PositionalGraph(model, signature)
    # Without global tokens: an encoder's graph (a task's heads read global tokens; a span reader's
    # graph reads none).
    globals_counts = (CHECK_GLOBALS, 0) if signature.kind == KIND_ENCODER else (
        (CHECK_GLOBALS,) if signature.reads_global_tokens else (0,))
    checks = []
    try:
        for length in lengths or check_lengths(config):
            for num_globals in globals_counts:
                inputs = sample_batch(signature, config, length=length, num_globals=num_globals, seed=length)
                if progress is not None:
                    progress(f"checking {length} long tokens, {num_globals} global tokens")
                checks.append(compare_batch(flat, session, signature, inputs))
    finally:
        model.set_attention_backend(None)
    return checks


def compare_batch(flat: PositionalGraph, session, signature: GraphSignature, inputs: dict) -> LengthCheck:
    """The graph and the model (`flat`) on one batch (inputs by name, in the signature's order): the
    largest difference per output over real tokens; ExportMismatch over TOLERANCE."""
    length = inputs["long_input_ids"].shape[1]
    num_globals = inputs["global_input_ids"].shape[1] if "global_input_ids" in inputs else 0
    with torch.no_grad():
        expected = flat(*inputs.values())
    got = session.run(list(signature.outputs), {name: value.numpy() for name, value in inputs.items()})
    differences = {}
    masks = {"long": inputs["long_attention_mask"].bool().numpy(),
             "global": inputs["global_attention_mask"].bool().numpy() if "global_attention_mask" in inputs else None}
    for name, axes, want, have in zip(signature.outputs, signature.output_axes, expected, got):
        want = want.float().numpy()
        if want.shape != have.shape:
            raise ExportMismatch(f"the ONNX model's {name} has shape {have.shape} at {length} long tokens and "
                                 f"{num_globals} global tokens, PyTorch's {want.shape}; nothing was written")
        # Real tokens only: what a padded position holds is no output (the decoders never read it).
        if len(axes) > 1 and axes[1] in masks:
            want, have = want[masks[axes[1]]], have[masks[axes[1]]]
        difference = np.abs(want - have)
        differences[name] = float(difference.max()) if difference.size else 0.0
        allowed = TOLERANCE * np.maximum(1.0, np.abs(want))
        if difference.size and (not np.isfinite(have).all() or (difference > allowed).any()):
            raise ExportMismatch(f"the ONNX model's {name} differs from PyTorch's by {differences[name]:.3g} at "
                                 f"{length} long tokens and {num_globals} global tokens (allowed {TOLERANCE:g}); "
                                 "nothing was written")
    return LengthCheck(length, num_globals, len(inputs["long_input_ids"]), differences)
