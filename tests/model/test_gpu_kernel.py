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
from functools import partial

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
SEED = 2**40 + 17  # dropout's, where a test fixes it


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
    radius: int = 3
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
                         hard_g2l=case.hard, hard_l2g=case.hard, local_attention_within_paragraph=True,
                         local_radius=case.radius, long_max_len=max(64, case.length))
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
        own, other, block = long_qkv, global_qkv, side.block_size
        mask, ids = side.long_mask_bias, side.long_relative_ids
    else:
        own, other, block = global_qkv, long_qkv, 0
        mask, ids = side.global_mask_bias, side.global_relative_ids
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


def scores_shape(ops: Operands) -> torch.Size:
    """The softmax's weights as the kernels index them: [B, h, Nq, N]."""
    batch, num_queries = ops.own_qkv.shape[:2]
    return torch.Size((batch, ops.settings.num_heads, num_queries, ops.settings.mask_bias.shape[-1]))


NAMES = ["context", "summed", "grad own_qkv", "grad other", "grad relative", "grad carried", "grad pre", "grad post"]


def assert_kernel_matches_reference(case: Case, dtype: torch.dtype, atol: float, rtol: float,
                                    drop_probability: float = 0.0) -> None:
    """TritonSoftmax's outputs and gradients against `reference`'s, on `case`'s operands; with dropout,
    the reference applies the keep mask the kernels draw for their seed (fixed here)."""
    ops = operands(case)
    ops.settings.drop_probability = drop_probability
    loss_weights = (torch.randn(*ops.own_qkv.shape[:2], ops.own_qkv.shape[2] // 3, dtype=torch.float64),
                    torch.randn(2, case.heads, *ops.settings.mask_bias.shape[2:], dtype=torch.float64))
    dropout = dict(keep=None)
    if drop_probability:
        dropout = dict(keep=gpu_softmax.keep_mask(SEED, drop_probability, scores_shape(ops), DEVICE).cpu(),
                       keep_scale=gpu_softmax.dropout_for(drop_probability).keep_scale)
    expected = outputs_and_gradients(partial(reference, **dropout), [
        t if t is None else t.requires_grad_() for t in ops.tensors()], ops.settings, loss_weights)
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


@pytest.mark.slow
def test_64_wide_tiles_of_long_inputs_equal_dense_reference(triton_kernels):
    # ETC's radius (blocks of 85, windows of 255 keys) over 1100 tokens: tiles of 64 queries that
    # straddle blocks, 64 keys; the global softmax's rows of 1105 + 5 keys in tiles of 64.
    for softmax in ("long", "global"):
        case = Case(softmax, length=1100, radius=84, heads=1, hard=False)
        assert gpu_softmax.tiles_for(1105 if softmax == "long" else 5, 260 if softmax == "long" else 1110, 8, 1,
                                     talking=False).block_n == 64
        assert_kernel_matches_reference(case, torch.float32, atol=2e-6, rtol=1e-4)


DROPOUT_CASES = {
    "long": Case("long"),
    "long,talking-heads": Case("long", talking=True),
    "global": Case("global", cross=True),
}


@pytest.mark.parametrize("case", DROPOUT_CASES.values(), ids=DROPOUT_CASES.keys())
def test_dropout_applies_the_keep_mask_of_its_seed(triton_kernels, monkeypatch, case):
    # Forward and backward draw the same mask, the one keep_mask returns for the seed.
    monkeypatch.setattr(gpu_softmax, "_draw_seed", lambda: SEED)
    assert_kernel_matches_reference(case, torch.float32, atol=2e-6, rtol=1e-4, drop_probability=0.3)


def test_dropout_keeps_the_expected_share_of_weights_independently_per_seed_and_head(triton_kernels):
    shape = torch.Size((2, 2, 32, 520))  # 67k weights
    keep = gpu_softmax.keep_mask(SEED, 0.3, shape, DEVICE).cpu()
    assert torch.equal(keep, gpu_softmax.keep_mask(SEED, 0.3, shape, DEVICE).cpu())  # a function of the seed
    kept = keep.float().mean().item()
    assert abs(kept - 0.7) < 5 * math.sqrt(0.7 * 0.3 / shape.numel())  # 5 standard deviations
    for other in (gpu_softmax.keep_mask(SEED + 1, 0.3, shape, DEVICE).cpu(), keep[:, 1:], keep[1:]):
        agreement = (other == keep[tuple(slice(0, n) for n in other.shape)]).float().mean().item()
        assert abs(agreement - (0.7**2 + 0.3**2)) < 0.015  # independent draws (other seed, head, batch)
    assert gpu_softmax.dropout_for(0.3).keep_scale == pytest.approx(1 / 0.7, rel=1e-6)
    assert not gpu_softmax.keep_mask(SEED, 1.0, shape, DEVICE).any() and gpu_softmax.dropout_for(1.0).keep_scale == 0


def test_dropout_seeds_come_from_torch_generator(triton_kernels):
    ops = operands(Case("long"))
    ops.settings.drop_probability = 0.3

    def run(seed: int) -> Tensor:
        torch.manual_seed(seed)
        with torch.no_grad():
            return TritonSoftmax.apply(*ops.inputs(torch.float32), ops.settings_for(torch.float32))[0]

    first = run(5)
    assert torch.equal(first, run(5))
    assert (first - run(6)).abs().max() > 0.1


def test_without_autograd_the_summed_scores_are_written_over_the_carried_ones(triton_kernels):
    ops = operands(Case("long", talking=True))
    expected_context, expected_summed = reference(*ops.tensors(), ops.settings)
    own_qkv, other, relative, carried, pre, post = ops.inputs(torch.float32)
    settings = replace(ops.settings_for(torch.float32), records_graph=False)  # (as the layer passes it under no_grad)
    with torch.no_grad():
        context, summed = TritonSoftmax.apply(own_qkv, other, relative, carried, pre, post, settings)
    assert summed.data_ptr() == carried.data_ptr()  # no new score-sized tensor
    torch.testing.assert_close(summed.double().cpu(), expected_summed, atol=1e-5, rtol=0)
    torch.testing.assert_close(context.double().cpu(), expected_context, atol=1e-5, rtol=0)
    carried = carried.detach().clone().requires_grad_()
    before = carried.detach().clone()
    _, summed = TritonSoftmax.apply(own_qkv, other, relative, carried, pre, post, replace(settings, records_graph=True))
    assert summed.data_ptr() != carried.data_ptr() and torch.equal(carried.detach(), before)


@pytest.mark.parametrize("talking", [False, True], ids=["plain", "talking-heads"])
def test_a_nan_score_reaches_the_output_as_in_the_reference(triton_kernels, talking):
    # A NaN in one long key (one dimension of one head): the rows that see it are NaN, the others not.
    ops = operands(Case("long", talking=talking, residual=False))
    hidden = ops.own_qkv.shape[-1] // 3
    ops.own_qkv[0, 5, hidden] = float("nan")  # long token 5's key, head 0
    expected, _ = reference(*ops.tensors(), ops.settings)
    with torch.no_grad():
        context, _ = TritonSoftmax.apply(*ops.inputs(torch.float32), ops.settings_for(torch.float32))
    assert expected.isnan().any() and not expected.isnan().all()
    assert torch.equal(context.isnan().cpu(), expected.isnan())


MODEL_CONFIGS = {
    "residual": dict(residual_attention=True),
    "residual-mean,hard-l2g": dict(residual_attention=True, residual_attention_mean=True, hard_l2g=True),
    "talking-heads": dict(talking_heads=True),
    "cross-kv": dict(cross_kv_projections=True),
    "absolute-positions,packed": dict(position_embedding_type="absolute"),
}


@pytest.mark.parametrize("overrides", MODEL_CONFIGS.values(), ids=MODEL_CONFIGS.keys())
def test_a_model_on_the_gpu_kernels_equals_the_dense_reference(triton_kernels, monkeypatch, overrides):
    # The attention layer's compiled-softmax call site, on TritonSoftmax: outputs and every
    # parameter's gradient of a 3-layer model against tests/model/dense_reference.py.
    monkeypatch.setattr(attention_module, "CompiledSoftmax", TritonSoftmax)
    monkeypatch.setattr(cpu_kernels, "available_for", lambda tensor: True)
    absolute = overrides.get("position_embedding_type") == "absolute"
    inputs = make_inputs(2, 13, 4, padding=True, structure=True, packed=absolute)  # (and packed rows)
    long_mask, global_mask = inputs["long_attention_mask"].bool(), inputs["global_attention_mask"].bool()
    weights = torch.randn(2, 13, 16, dtype=torch.float64), torch.randn(2, 4, 16, dtype=torch.float64)

    def gradients(model, forward) -> tuple[list, dict]:
        long_hidden, global_hidden = forward(model)
        outputs = [long_hidden.double().cpu()[long_mask], global_hidden.double().cpu()[global_mask]]
        (outputs[0] * weights[0][long_mask]).sum().add((outputs[1] * weights[1][global_mask]).sum()).backward()
        return [output.detach() for output in outputs], {
            name: parameter.grad.double().cpu() for name, parameter in model.named_parameters()
            if parameter.grad is not None}

    def on_kernels(model):
        output = model(**{name: tensor.to(DEVICE) for name, tensor in inputs.items()})
        return output.long_hidden_state, output.global_hidden_state

    kernel_outputs, kernel_gradients = gradients(make_model(tiny_config(**overrides)).float().to(DEVICE), on_kernels)
    dense_outputs, dense_gradients = gradients(make_model(tiny_config(**overrides)),
                                               lambda model: dense_forward(model, inputs))
    for got, expected in zip(kernel_outputs, dense_outputs):
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)
    assert kernel_gradients.keys() == dense_gradients.keys()
    for name in kernel_gradients:
        torch.testing.assert_close(kernel_gradients[name], dense_gradients[name], atol=1e-4, rtol=1e-3, msg=name)


def test_importing_the_gpu_attention_imports_no_triton():
    script = ("import os, sys; import longdoc, longdoc.model.attention, longdoc.model.kernels.gpu; "
              "print('triton' in sys.modules, 'TRITON_INTERPRET' in os.environ)")
    environment = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["False", "False"]


def test_without_triton_the_kernels_say_what_is_missing(monkeypatch):
    monkeypatch.setattr(gpu_softmax, "triton_available", lambda: False)
    ops = operands(Case("global"))
    with pytest.raises(RuntimeError, match=r"need Triton, which is not installed: .*`pip install triton`"):
        TritonSoftmax.apply(*ops.inputs(torch.float32), ops.settings_for(torch.float32))


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU tensors outside the interpreter")
def test_cpu_tensors_outside_the_interpreter_are_refused(triton_kernels, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    ops = operands(Case("global"))
    with pytest.raises(ValueError, match="take CUDA tensors, not cpu ones"):
        TritonSoftmax.apply(*ops.inputs(torch.float32), ops.settings_for(torch.float32))
