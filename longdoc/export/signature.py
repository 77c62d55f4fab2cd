"""What an exported graph takes and gives: its inputs (by the input schema's specs), its outputs, and
the values that stand for an input a batch does not hold.

An ONNX graph has a fixed list of inputs, where `GlobalLocalModel.forward` takes any subset of its
arguments. The graph of a model that reads global tokens (a bare encoder, a task model) takes every
encoder input (`longdoc.model.inputs.ENCODER_INPUTS`; `global_features` only where the config has a
feature size) and the task model's `prediction_inputs`; the graph of a span reader takes the long
input, its mask and token types (a lifted reader reads no global tokens). A batch that lacks one of
them gets its `NEUTRAL` value, which the model computes exactly as it computes the input's absence
(tests/export pin each): token types 0, masks 1, no mention (-1), one paragraph (0), no global token
that sees all, one example per row (0). `sentence_ids` has none (without it no hard mask applies;
with every id -1 a global token sees no long token): a batch must hold it.

Axes are the schema's names: "batch", "long", "global", and a task's own (OpenKP's "word"); each is
dynamic in the graph but "feature", the config's `global_feature_size`.
"""

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from longdoc.model.inputs import ENCODER_INPUTS, InputSpec

KIND_ENCODER = "encoder"
ENCODER_OUTPUTS = ("long_hidden_state", "global_hidden_state")
STATIC_AXES = {"feature"}
LONG_ONLY_INPUTS = ("long_input_ids", "long_attention_mask", "long_token_type_ids")

# An absent input -> the value that the model computes exactly as the absence (see the docstring).
NEUTRAL = {
    "long_attention_mask": 1, "global_attention_mask": 1, "long_token_type_ids": 0, "global_token_type_ids": 0,
    "mention_ids": -1, "long_paragraph_ids": 0, "global_paragraph_ids": 0, "global_sees_all": False,
    "long_example_ids": 0, "global_example_ids": 0,
}


@dataclass(frozen=True)
class GraphSignature:
    """kind: "encoder", or the task model's task name; inputs: the graph's inputs in order; outputs: the
    names of its outputs in order (an encoder's hidden states, a task model's typed output fields);
    output_axes: each output's axes, "batch", "long", "global" or a size (what the comparisons mask)."""

    kind: str
    inputs: tuple[InputSpec, ...]
    outputs: tuple[str, ...]
    output_axes: tuple[tuple[str | int, ...], ...] = ()

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.inputs)

    @property
    def reads_global_tokens(self) -> bool:
        return "global_input_ids" in self.input_names

    def to_json(self) -> dict:
        return {"kind": self.kind, "outputs": list(self.outputs), "output_axes": [list(axes) for axes in self.output_axes],
                "inputs": [{"name": spec.name, "axes": list(spec.axes), "dtype": str(spec.dtype).removeprefix("torch.")}
                           for spec in self.inputs]}


def encoder_input_specs(config, reads_global_tokens: bool = True) -> tuple[InputSpec, ...]:
    """The encoder inputs of a graph: all of them, or the long ones only (see the module docstring)."""
    if not reads_global_tokens:
        return tuple(spec for spec in ENCODER_INPUTS if spec.name in LONG_ONLY_INPUTS)
    return tuple(spec for spec in ENCODER_INPUTS
                 if spec.name != "global_features" or config.global_feature_size > 0)


def signature_of(model: nn.Module) -> GraphSignature:
    """The signature of `model`'s graph: a GlobalLocalModel, or a task model (longdoc.model.task_model)
    whose outputs are those its forward gives. The outputs' axes are found by running the model on
    three small batches: one more long token, then one more global token, shows which axis follows which."""
    from longdoc.model.pretrained import GlobalLocalModel
    from longdoc.model.span_reader import SpanReader

    if isinstance(model, GlobalLocalModel):
        signature = GraphSignature(KIND_ENCODER, encoder_input_specs(model.config), ENCODER_OUTPUTS)
    else:
        inputs = encoder_input_specs(model.config, not isinstance(model, SpanReader)) + tuple(model.prediction_inputs)
        signature = GraphSignature(model.task_name, inputs, ())
    reads_globals = signature.reads_global_tokens
    shapes = []
    for length, num_globals in ((11, 6), (12, 6), (11, 7)):
        sample = sample_batch(signature, model.config, length=length, num_globals=num_globals if reads_globals else 0)
        with torch.no_grad():
            output = model.eval()(**sample)
        shapes.append({name: value.shape for name, value in output.items() if isinstance(value, Tensor) and name != "loss"})
    base, longer, more_globals = shapes
    axes = tuple(tuple("batch" if dim == 0 else "long" if size != longer[name][dim] else
                       "global" if size != more_globals[name][dim] else size for dim, size in enumerate(shape))
                 for name, shape in base.items())
    return GraphSignature(signature.kind, signature.inputs, tuple(base), axes)


class PositionalGraph(nn.Module):
    """`model` called with the signature's inputs as positional tensors and returning its outputs as
    a tuple: the flat form an ONNX graph has."""

    def __init__(self, model: nn.Module, signature: GraphSignature):
        super().__init__()
        self.model, self.signature = model, signature

    def forward(self, *tensors: Tensor) -> tuple[Tensor, ...]:
        output = self.model(**dict(zip(self.signature.input_names, tensors)))
        return tuple(getattr(output, name) for name in self.signature.outputs)


def axis_sizes(batch: int, length: int, num_globals: int, config) -> dict[str, int]:
    """The size of each named axis of a sample batch (a task's own axes: 4)."""
    return {"batch": batch, "long": length, "global": num_globals, "feature": config.global_feature_size}


def sample_batch(signature: GraphSignature, config, *, length: int, num_globals: int, batch: int = 2,
                 seed: int = 0, padding: bool = True, packed: bool = False) -> dict[str, Tensor]:
    """Random inputs of the signature, valid for `config`, drawn from `seed`.

    Ids lie inside their vocabularies; links (sentence, mention) point to real global tokens; there
    are paragraphs and global tokens that see all. A task's own inputs follow their spec: 0/1 for
    masks, ids in [pad, 2) for those padded with -1; its own axes have size 4. Padded positions hold
    each input's padding value, as the task's collate pads them.

    Args:
        signature: the graph's inputs (an encoder's or a task model's).
        config: the encoder's config (vocabularies, pad id, global feature size).
        length: long tokens per row (L).
        num_globals: global tokens per row (G).
        batch: rows (B).
        seed: the seed of the random draws.
        padding: the last row's long input a third shorter and its last global token padding (with
            more than one row, and for the global token more than one global token).
        packed: each row two examples (example ids 1 then 2 over each half of both inputs); off, one
            (example id 0).

    Returns:
        The inputs by name, in the signature's order.
    """
    generator = torch.Generator().manual_seed(seed)
    sizes = axis_sizes(batch, length, num_globals, config)
    shape = lambda spec: tuple(axis if isinstance(axis, int) else sizes.get(axis, 4) for axis in spec.axes)
    integers = lambda low, high, spec: torch.randint(low, high, shape(spec), generator=generator)
    long_mask = torch.ones(batch, length, dtype=torch.long)
    global_mask = torch.ones(batch, num_globals, dtype=torch.long)
    if padding and batch > 1:
        long_mask[-1, max(1, length - length // 3):] = 0
        if num_globals > 1:
            global_mask[-1, -1] = 0
    values = {"long_attention_mask": long_mask, "global_attention_mask": global_mask}
    for spec in signature.inputs:
        name = spec.name
        if name in values:
            continue
        if name in ("long_input_ids", "global_input_ids"):
            values[name] = integers(1, config.vocab_size, spec)
        elif name.endswith("token_type_ids"):
            values[name] = integers(0, config.type_vocab_size, spec)
        elif name in ("sentence_ids", "mention_ids"):
            links = integers(-1, max(num_globals, 0), spec) if num_globals else torch.full(shape(spec), -1)
            if name == "sentence_ids":
                links = links.sort(-1).values
            else:
                links = torch.where(torch.rand(shape(spec), generator=generator) < 0.2, links, -1)
            real = global_mask.gather(1, links.clamp(min=0)).bool() if num_globals else torch.zeros_like(links, dtype=torch.bool)
            values[name] = torch.where(real, links, -1)
        elif name.endswith("paragraph_ids"):
            values[name] = integers(0, 2, spec).sort(-1).values
        elif name.endswith("example_ids"):
            axis = shape(spec)[1]
            values[name] = (1 + (torch.arange(axis) >= axis // 2)).expand(batch, axis).clone() if packed \
                else torch.zeros(batch, axis, dtype=torch.long)
        elif spec.dtype == torch.bool:
            values[name] = torch.rand(shape(spec), generator=generator) < 0.3
        elif spec.dtype.is_floating_point:
            values[name] = torch.randn(shape(spec), generator=generator)
        else:
            low = spec.pad if isinstance(spec.pad, int) and spec.pad < 0 else 0
            values[name] = integers(low, 2, spec).to(spec.dtype)
    # Padded positions hold each input's padding value, as the task's collate pads them.
    for spec in signature.inputs:
        mask = long_mask if spec.axes[1:2] == ("long",) else global_mask if spec.axes[1:2] == ("global",) else None
        if mask is not None and spec.name not in ("long_attention_mask", "global_attention_mask"):
            pad = config.pad_token_id if spec.name.endswith("input_ids") else spec.pad_value(config.pad_token_id)
            padded = ~mask.bool().view(*mask.shape, *([1] * (values[spec.name].dim() - 2)))
            values[spec.name] = values[spec.name].masked_fill(padded, pad)
    return {name: values[name] for name in signature.input_names}
