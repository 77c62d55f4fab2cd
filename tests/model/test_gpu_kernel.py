"""The GPU attention kernels (longdoc.model.kernels.gpu) against a dense float64 reference of one
softmax written here from DESIGN.md's rules (sections 1-3), over both softmaxes, masks, packed rows,
cross projections, talking heads, residual scores and dropout; and a tiny model on them against
tests/model/dense_reference.py.

Triton's interpreter runs them on CPU tensors: TRITON_INTERPRET=1 is set here, before the kernels
(and so Triton) are imported. With TRITON_INTERPRET=0 on a machine with a CUDA GPU, the same tests
run the compiled kernels on the GPU.
"""

import math
import os
import subprocess
import sys
from dataclasses import dataclass, replace

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from torch import Tensor

from longdoc.model import attention as attention_module
from longdoc.model import kernels as cpu_kernels
from longdoc.model.inputs import check_and_collect
from longdoc.model.kernels.gpu import TritonSoftmax, softmax as gpu_softmax, triton_available
from longdoc.model.side_inputs import RelativeIdLayout, build_side_inputs
from tests.model.conftest import make_inputs, tiny_config
from tests.model.dense_reference import dense_forward
from tests.model.test_attention import make_model

DEVICE = "cpu" if os.environ["TRITON_INTERPRET"] == "1" else "cuda"


@pytest.fixture
def triton_kernels():
    if not triton_available():
        message = "Triton is not installed (pip install triton)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    if DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.skip("TRITON_INTERPRET=0 runs the compiled kernels, which need a CUDA GPU")


@pytest.fixture
def bfloat16_dots(monkeypatch):
    """Triton's interpreter keeps bfloat16 tensors as their uint16 bit patterns and multiplies those
    in tl.dot (triton-lang/triton#11584; its debugging guide says it does not do bfloat16
    arithmetic): here it converts them to float32 first, as the GPU's tensor cores multiply them
    (exactly, accumulating in float32). Casts to and from bfloat16, all the kernels do besides,
    it gets right."""
    if DEVICE != "cpu":
        return
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    create_dot = interpreter.InterpreterBuilder.create_dot

    def widened(handle):
        if handle.dtype != tl.bfloat16:
            return handle
        return interpreter.TensorHandle((handle.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot",
                        lambda self, a, b, *rest: create_dot(self, widened(a), widened(b), *rest))


@dataclass
class Settings:
    """What TritonSoftmax reads of a softmax's settings (the attention layer passes its own record)."""

    num_heads: int
    block_size: int
    mask_bias: Tensor
    relative_ids: Tensor | None
    links: Tensor | None
    layout: RelativeIdLayout | None
    scale: float = 1.0
    keep_summed: bool = True
    drop_probability: float = 0.0
    key_ranges: Tensor | None = None
    records_graph: bool = True


@dataclass(frozen=True)
class Case:
    """One softmax's configuration."""

    softmax: str  # "long": blocked long queries over [window | globals]; "global": globals over [globals | long]
    relative: bool = True
    residual: bool = True  # carried scores in, summed scores out
    talking: bool = False
    cross: bool = False  # the second keys and values from a cross projection [B, N2, 2H]
    packed: bool = False  # two examples per row (example ids)
    hard: bool = True  # hard g2l and l2g
    length: int = 18  # long tokens: blocks of 4 (radius 3), the last one padded; row 1 padded from 12
    num_globals: int = 5
    heads: int = 2
    head_size: int = 8
    scale: float = 1.0


@dataclass
class Operands:
    """TritonSoftmax's arguments (float64 leaves, for the reference; `inputs` casts them)."""

    own_qkv: Tensor
    other: Tensor
    relative: Tensor | None
    carried: Tensor | None
    pre: Tensor | None
    post: Tensor | None
    settings: Settings

    def tensors(self) -> list[Tensor | None]:
        return [self.own_qkv, self.other, self.relative, self.carried, self.pre, self.post]

    def inputs(self, dtype: torch.dtype) -> list[Tensor | None]:
        """Copies in `dtype` on the test device that require grad."""
        return [None if t is None else t.detach().to(DEVICE, dtype).requires_grad_() for t in self.tensors()]

    def settings_for(self, dtype: torch.dtype) -> Settings:
        s = self.settings
        mask = s.mask_bias.clamp(min=torch.finfo(dtype).min / 2).to(DEVICE, dtype)
        on_device = lambda t: None if t is None else t.to(DEVICE)
        return replace(s, mask_bias=mask, relative_ids=on_device(s.relative_ids), links=on_device(s.links))


def operands(case: Case, seed: int = 0) -> Operands:
    """Random projections, relative terms, carried scores and head mixes, with the masks and relative
    ids the model builds for random structure (sentences, mentions, paragraphs, padding)."""
    config = tiny_config(hidden_size=case.heads * case.head_size, num_attention_heads=case.heads,
                         hard_g2l=case.hard, hard_l2g=case.hard, local_attention_within_paragraph=True)
    inputs = make_inputs(2, case.length, case.num_globals, padding=True, structure=True, seed=seed + 1,
                         packed=case.packed)
    side = build_side_inputs(
        check_and_collect(config, inputs), local_radius=config.local_radius,
        max_relative_distance=config.max_relative_distance, hard_g2l=config.hard_g2l, hard_l2g=config.hard_l2g,
        local_attention_within_paragraph=True, dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    random = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)
    batch, heads, hidden = 2, case.heads, case.heads * case.head_size
    long_qkv, global_qkv = random(batch, side.padded_length, 3 * hidden), random(batch, case.num_globals, 3 * hidden)
    if case.softmax == "long":
        own, other, block, mask, ids = long_qkv, global_qkv, side.block_size, side.long_mask_bias, side.long_relative_ids
    else:
        own, other, block, mask, ids = global_qkv, long_qkv, 0, side.global_mask_bias, side.global_relative_ids
    if case.cross:
        other = random(*other.shape[:2], 2 * hidden)
    scores_shape = (batch, heads, *mask.shape[2:])
    mixes = [torch.eye(heads, dtype=torch.float64) + 0.3 * random(heads, heads) for _ in range(2)]
    settings = Settings(heads, block, mask, ids if case.relative else None, side.links, side.relative_layout,
                        scale=case.scale, keep_summed=case.residual)
    return Operands(own, other, random(*scores_shape[:-1], config.relative_vocab_size) if case.relative else None,
                    random(*scores_shape) if case.residual else None, *(mixes if case.talking else (None, None)),
                    settings)


def reference(own_qkv: Tensor, other: Tensor, relative: Tensor | None, carried: Tensor | None, pre: Tensor | None,
              post: Tensor | None, settings: Settings, keep: Tensor | None = None,
              keep_scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """One softmax, dense, per query row: its keys are those of the first piece (with a window of
    block b: keys (i - 1) b .. (i + 2) b - 1 of query block i, zero outside the input; else all), then
    all second keys. summed = q.k / sqrt(d) + relative[ids] + carried; weights = post @
    softmax(scale * (pre @ summed) + mask) (the mixes across heads), times dropout's `keep`;
    context = weights @ values. Returns (context [B, Nq, H], summed [B, h, ..., Nq, N])."""
    heads = settings.num_heads
    batch, num_queries, width3 = own_qkv.shape
    hidden, size = width3 // 3, width3 // 3 // heads
    query, first_keys, first_values = own_qkv.unflatten(-1, (3, heads, size)).permute(2, 0, 3, 1, 4)
    second_keys, second_values = other.unflatten(-1, (-1, heads, size)).permute(2, 0, 3, 1, 4)[-2:]
    b, count = settings.block_size, first_keys.shape[2]
    if b:
        index = (torch.arange(num_queries)[:, None] // b - 1) * b + torch.arange(3 * b)  # [Nq, 3b]
        inside = ((index >= 0) & (index < count)).unsqueeze(-1)
        first = [piece[:, :, index.clamp(0, count - 1)] * inside for piece in (first_keys, first_values)]
    else:
        first = [piece.unsqueeze(2).expand(-1, -1, num_queries, -1, -1) for piece in (first_keys, first_values)]
    second = [piece.unsqueeze(2).expand(-1, -1, num_queries, -1, -1) for piece in (second_keys, second_values)]
    keys, values = (torch.cat([f, s], dim=3) for f, s in zip(first, second))  # [B, h, Nq, N, d]
    summed = (query.unsqueeze(3) * keys).sum(-1) / math.sqrt(size)
    width = summed.shape[-1]
    if relative is not None:
        ids = settings.relative_ids.reshape(batch, 1, num_queries, width).expand(-1, heads, -1, -1).long()
        summed = summed + relative.reshape(batch, heads, num_queries, -1).gather(-1, ids)
    if carried is not None:
        summed = summed + carried.reshape(summed.shape)
    logits = summed if pre is None else torch.einsum("gh,bhqk->bgqk", pre, summed)
    probs = torch.softmax(settings.scale * logits + settings.mask_bias.reshape(batch, 1, num_queries, width), -1)
    weights = probs if post is None else torch.einsum("gh,bhqk->bgqk", post, probs)
    if keep is not None:
        weights = weights * keep.reshape(weights.shape) * keep_scale
    context = (weights.unsqueeze(-1) * values).sum(-2)  # [B, h, Nq, d]
    blocked = (batch, heads, *settings.mask_bias.shape[2:])
    return context.transpose(1, 2).reshape(batch, num_queries, hidden), (
        summed.reshape(blocked) if settings.keep_summed else None)


def outputs_and_gradients(function, inputs: list, settings, loss_weights: tuple[Tensor, Tensor]) -> list:
    """(context, summed or None) of function(*inputs, settings) and the gradients of a random linear
    loss on both with respect to every input given, all as float64 on the CPU."""
    context, summed = function(*inputs, settings)
    loss = (context.double().cpu() * loss_weights[0]).sum()
    if summed is not None:
        loss = loss + (summed.double().cpu() * loss_weights[1]).sum()
    given = [tensor for tensor in inputs if tensor is not None]
    gradients = torch.autograd.grad(loss, given)
    as_double = lambda tensor: None if tensor is None else tensor.detach().double().cpu()
    return [as_double(context), as_double(summed), *map(as_double, gradients)]


NAMES = ["context", "summed", "grad own_qkv", "grad other", "grad relative", "grad carried", "grad pre", "grad post"]


def assert_kernel_matches_reference(case: Case, dtype: torch.dtype, atol: float, rtol: float) -> None:
    ops = operands(case)
    loss_weights = (torch.randn(*ops.own_qkv.shape[:2], ops.own_qkv.shape[2] // 3, dtype=torch.float64),
                    torch.randn(2, case.heads, *ops.settings.mask_bias.shape[2:], dtype=torch.float64))
    expected = outputs_and_gradients(reference, [t if t is None else t.requires_grad_() for t in ops.tensors()],
                                     ops.settings, loss_weights)
    got = outputs_and_gradients(TritonSoftmax.apply, ops.inputs(dtype), ops.settings_for(dtype), loss_weights)
    names = [name for name, tensor in zip(NAMES[:2], expected[:2])] + [
        name for name, tensor in zip(NAMES[2:], ops.tensors()) if tensor is not None]
    assert len(got) == len(expected) == len(names)
    for name, actual, wanted in zip(names, got, expected):
        if wanted is None:
            assert actual is None, name
            continue
        # (an absolute tolerance relative to the tensor's scale: gradients range from 1e-3 to 1e2)
        scale = wanted.abs().max().item() if wanted.numel() else 0.0
        torch.testing.assert_close(actual, wanted, atol=atol * scale, rtol=rtol, msg=name)


CASES = {
    "long": Case("long"),
    "long,plain": Case("long", relative=False, residual=False, hard=False),
    "long,talking-heads": Case("long", talking=True),
    "long,talking-heads,running-mean": Case("long", talking=True, scale=1 / 3),
    "long,cross": Case("long", cross=True),
    "long,packed": Case("long", packed=True),
    "long,no-globals": Case("long", num_globals=0, hard=False),
    "long,one-block": Case("long", length=3, num_globals=2),
    "long,head-size-20": Case("long", head_size=20, heads=3),
    "global": Case("global"),
    "global,running-mean": Case("global", residual=False, scale=1 / 3),
    "global,talking-heads,cross": Case("global", talking=True, cross=True),
    "global,packed,no-relative": Case("global", packed=True, relative=False),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_float32_outputs_and_gradients_equal_dense_reference(triton_kernels, case):
    assert_kernel_matches_reference(case, torch.float32, atol=2e-6, rtol=1e-4)


LOW_PRECISION_CASES = {
    "long,bfloat16": (Case("long"), torch.bfloat16),
    "long,talking-heads,bfloat16": (Case("long", talking=True, cross=True), torch.bfloat16),
    "global,bfloat16": (Case("global", packed=True), torch.bfloat16),
    "global,talking-heads,float16": (Case("global", talking=True), torch.float16),
}


@pytest.mark.parametrize("case,dtype", LOW_PRECISION_CASES.values(), ids=LOW_PRECISION_CASES.keys())
def test_half_precision_outputs_and_gradients_are_close_to_dense_reference(triton_kernels, bfloat16_dots, case, dtype):
    # bf16 / fp16 operands and outputs, float32 inside: errors of the order of their rounding.
    assert_kernel_matches_reference(case, dtype, atol=2e-2, rtol=2e-2)
