"""A model -> an ONNX graph, through torch's own exporter (`torch.onnx.export(..., dynamo=True)`).

torch.export traces the forward with every axis of every input dynamic (`Dim.DYNAMIC`; a Dim with
a range of its own is refused: torch's solver cannot prove the padding's guards, which hold at
every length). The attention runs on the eager backend (`auto` picks it while export traces), in
blocks of r + 1 long tokens and at least two blocks whatever the traced length
(longdoc.model.side_inputs.blocks_for), so one graph serves every long length from 2 to
`long_max_len`, every number of global tokens and every batch size. The traced batch has at
least two rows, two global tokens and two of any other axis: torch.export specialises sizes 0
and 1.

Opsets: torch's exporter writes opset 18 or later, and converts to an older one asked for with
ONNX's version converter, keeping 18 (with a warning) where the conversion fails; here an opset
the graph could not be converted to is refused, naming the operator (`OpsetError`).
"""

import logging
import warnings

import torch

from longdoc.errors import InputError
from longdoc.export.signature import STATIC_AXES, GraphSignature, PositionalGraph, sample_batch

DEFAULT_OPSET = 18
# The sizes traced (any would do; none may be 0 or 1).
TRACED = dict(batch=2, num_globals=3)


class OpsetError(InputError):
    """An opset the graph cannot be written in: the message names the operator."""


def traced_length(config) -> int:
    """The long length the export traces: one and a half blocks, so that it is neither a multiple of
    the block nor a length the checks use (longdoc.export.check)."""
    return min(config.long_max_len, config.local_radius + 1 + (config.local_radius + 1) // 2 + 1)


def export_onnx(model: torch.nn.Module, signature: GraphSignature, opset: int = DEFAULT_OPSET):
    """The ONNX model (an `onnx.ModelProto`) of `model` (eval mode, eager attention) with the inputs and
    outputs of `signature`, every axis dynamic, in opset `opset`."""
    import onnx

    config = model.config
    model.eval()
    model.set_attention_backend("eager")
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)  # (its notes on optional packages it does not need here)
    try:
        num_globals = TRACED["num_globals"] if signature.reads_global_tokens else 0
        inputs = sample_batch(signature, config, length=traced_length(config), num_globals=num_globals,
                              batch=TRACED["batch"])
        dynamic = tuple({axis: torch.export.Dim.DYNAMIC for axis, name in enumerate(spec.axes)
                         if isinstance(name, str) and name not in STATIC_AXES} for spec in signature.inputs)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's notes to torch developers
            program = torch.onnx.export(
                PositionalGraph(model, signature), tuple(inputs.values()), dynamic_shapes=(dynamic,),
                input_names=list(signature.input_names), output_names=list(signature.outputs),
                opset_version=max(opset, DEFAULT_OPSET), dynamo=True, verbose=False, optimize=True,
            )
    finally:
        model.set_attention_backend(None)
        exporter_log.setLevel(level)
    proto = program.model_proto
    if opset < DEFAULT_OPSET:
        proto = _converted(proto, opset)
    onnx.checker.check_model(proto, full_check=False)
    return proto


def _converted(proto, opset: int):
    """`proto` in the older `opset` by ONNX's version converter, or an OpsetError naming the operator."""
    import onnx
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(proto, opset)
    except Exception as error:  # the converter raises RuntimeError, or ValueError for an unknown adapter
        operator = _operator_named(str(error)) or "the graph"
        raise OpsetError(f"--opset {opset}: ONNX's version converter cannot take {operator} to opset {opset} "
                         f"({str(error).splitlines()[0][:200]}); use --opset {DEFAULT_OPSET} or later") from None
    found = {entry.domain: entry.version for entry in converted.opset_import}.get("", None)
    if found != opset:
        raise OpsetError(f"--opset {opset}: the graph was left at opset {found}; use --opset {DEFAULT_OPSET} or later")
    onnx.checker.check_model(converted)
    return converted


def _operator_named(message: str) -> str | None:
    """The operator an error of ONNX's version converter names ("No Adapter To Version $17 for Pad",
    "No Previous Version of LayerNormalization exists")."""
    import re

    match = re.search(r"(?:\bfor|Version of) (?:op )?'?([A-Z][A-Za-z0-9]+)", message)
    return f"operator {match.group(1)}" if match else None
