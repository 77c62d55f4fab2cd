"""The GPU attention kernels (longdoc.model.kernels.gpu) against a dense float64 reference of one
softmax written here from DESIGN.md's rules (sections 1-3), over both softmaxes, masks, packed rows,
cross projections, talking heads, residual scores and dropout. (A model on them, the gpu backend,
against tests/model/dense_reference.py: tests/model/backends/test_backends.py.)

Without a CUDA GPU, Triton's interpreter runs them on CPU tensors (tests/conftest.py sets
TRITON_INTERPRET=1 before Triton is imported); on a GPU the same tests run the compiled kernels.
"""

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch
from torch import Tensor

from longdoc.model.backends.gpu import TritonSoftmax
from longdoc.model.kernels.gpu import softmax as gpu_softmax, triton_available
from tests.model.one_softmax import Case, Operands, operands, reference

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
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
    why = DEVICE == "cpu" and gpu_softmax.interpreter_failure()
    if why:  # (an older Triton beside a newer numpy; the compiled kernels are not concerned)
        if os.environ.get("CI") == "true":  # (CI installs the newest Triton, whose interpreter runs them)
            pytest.fail(why)
        pytest.skip(why)


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


def arguments(ops: Operands, dtype: torch.dtype = torch.float32) -> list:
    """TritonSoftmax.apply's arguments for `ops` in `dtype` on the test device."""
    return [*ops.inputs(dtype, DEVICE), ops.settings_for(dtype, DEVICE)]


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
    ops = operands(case).with_dropout(drop_probability)
    # Seeded like the operands, so that the result does not depend on the tests run before: a
    # gradient summed over every pair (the talking heads' mixes') cancels, for some weights, to a
    # small part of its terms, and its bfloat16 error, which follows the terms, then nears the
    # tolerance scaled to the result (the interpreter, 12 draws: 0.0002 to 0.0198 of the 0.02 allowed;
    # above it after `pytest -k "bf16 or bfloat16" tests`, which failed).
    generator = torch.Generator().manual_seed(0)
    loss_weights = (torch.randn(*ops.own_qkv.shape[:2], ops.own_qkv.shape[2] // 3, dtype=torch.float64,
                                generator=generator),
                    torch.randn(2, case.heads, *ops.settings.mask_bias.shape[2:], dtype=torch.float64,
                                generator=generator))
    dropout = dict(keep=None)
    if drop_probability:
        dropout = dict(keep=gpu_softmax.keep_mask(SEED, drop_probability, scores_shape(ops), DEVICE).cpu(),
                       keep_scale=gpu_softmax.dropout_for(drop_probability).keep_scale)
    expected = outputs_and_gradients(partial(reference, **dropout), [
        t if t is None else t.requires_grad_() for t in ops.tensors()], ops.settings, loss_weights)
    *inputs, settings = arguments(ops, dtype)
    got = outputs_and_gradients(TritonSoftmax.apply, inputs, settings, loss_weights)
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
    "long,blocks-of-two-tiles": Case("long", length=60, radius=20, num_globals=3),
    "long,blocks-of-two-tiles,plain": Case("long", length=60, radius=20, relative=False, residual=False),
    "global": Case("global"),
    "global,running-mean": Case("global", residual=False, scale=1 / 3),
    "global,talking-heads,cross": Case("global", talking=True, cross=True),
    "global,talking-heads,plain": Case("global", talking=True, relative=False, residual=False),
    "global,packed,no-relative": Case("global", packed=True, relative=False),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_float32_outputs_and_gradients_equal_dense_reference(triton_kernels, case):
    assert_kernel_matches_reference(case, torch.float32, atol=2e-6, rtol=1e-4)


LOW_PRECISION_CASES = {
    "long,bfloat16": (Case("long"), torch.bfloat16),
    "long,talking-heads,bfloat16": (Case("long", talking=True, cross=True), torch.bfloat16),
    "long,blocks-of-two-tiles,talking-heads,bfloat16": (Case("long", length=60, radius=20, talking=True),
                                                        torch.bfloat16),
    "global,bfloat16": (Case("global", packed=True), torch.bfloat16),
    "global,talking-heads,float16": (Case("global", talking=True), torch.float16),
}


@pytest.mark.parametrize("case,dtype", LOW_PRECISION_CASES.values(), ids=LOW_PRECISION_CASES.keys())
def test_half_precision_outputs_and_gradients_are_close_to_dense_reference(triton_kernels, bfloat16_dots, case, dtype):
    # bf16 / fp16 operands and outputs, the carried and summed scores among them (stored in the
    # operands' dtype, as the next layer reads them), float32 inside: errors of the order of their
    # rounding (2^-8 in bfloat16), within 2e-2 of each tensor's largest value (and 2e-2 relative).
    assert_kernel_matches_reference(case, dtype, atol=2e-2, rtol=2e-2)


@pytest.mark.slow
@pytest.mark.parametrize("softmax", ["long", "global"])
def test_wide_tiles_of_long_inputs_equal_dense_reference(triton_kernels, bfloat16_dots, softmax):
    # ETC's radius (blocks of 85, windows of 255 keys) over 300 tokens (4 blocks): tiles of 32
    # queries, three per block (the last one's 11 rows past the block's end), 64 keys; the global
    # softmax's rows of 5 + 340 keys in tiles of 64.
    case = Case(softmax, length=300, radius=84, heads=1, hard=False)
    num_queries, width, window = (340, 260, 85) if softmax == "long" else (5, 345, 0)
    tiles = gpu_softmax.tiles_for(num_queries, width, window, case.head_size, case.heads, False, torch.bfloat16)
    assert (tiles.block_m, tiles.block_n) == ((32, 64) if softmax == "long" else (16, 64))
    assert_kernel_matches_reference(case, torch.bfloat16, atol=2e-2, rtol=2e-2)


def test_a_windowed_softmax_has_tiles_of_its_blocks():
    # Blocks of 85 queries: three tiles of 32 each (96 rows, as with 16); of 80: five of 16 (not three of 32).
    tiles = lambda window: gpu_softmax.tiles_for(4 * window, 3 * window + 16, window, 64, 12, False, torch.bfloat16)
    assert tiles(85).block_m == 32 and gpu_softmax.query_tile_count(340, 85, 32) == 4 * 3
    assert tiles(80).block_m == 16 and gpu_softmax.query_tile_count(320, 80, 16) == 4 * 5
    assert gpu_softmax.query_tile_count(256, 0, 32) == 8  # (no window: tiles of consecutive queries)


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
    ops = operands(Case("long")).with_dropout(0.3)

    def run(seed: int) -> Tensor:
        torch.manual_seed(seed)
        with torch.no_grad():
            return TritonSoftmax.apply(*arguments(ops))[0]

    first = run(5)
    assert torch.equal(first, run(5))
    assert (first - run(6)).abs().max() > 0.1


def test_without_autograd_the_summed_scores_are_written_over_the_carried_ones(triton_kernels):
    ops = operands(Case("long", talking=True))
    expected_context, expected_summed = reference(*ops.tensors(), ops.settings)
    own_qkv, other, relative, carried, pre, post = ops.inputs(torch.float32, DEVICE)
    settings = replace(ops.settings_for(torch.float32, DEVICE), records_graph=False)  # (as under no_grad)
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
        context, _ = TritonSoftmax.apply(*arguments(ops))
    assert expected.isnan().any() and not expected.isnan().all()
    assert torch.equal(context.isnan().cpu(), expected.isnan())


# An H100's shared memory per block (227 KB; a block may not take more)
H100_SHARED_MEMORY = 232448


@pytest.fixture(scope="module")
def sm90_builds() -> list[dict]:
    """Triton's compiler, not its interpreter, on the kernels the layer's calls launch
    (tests/model/gpu_kernel_builds.py, in a process of its own): one record per build; its exit
    status says whether a kernel that must keep its values in registers spilled."""
    if not triton_available():
        pytest.skip("Triton is not installed (pip install triton)")
    # (the module is found from the checkout: without PYTHONSAFEPATH, which the GPU check sets)
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONSAFEPATH"}
    run = subprocess.run([sys.executable, "-m", "tests.model.gpu_kernel_builds"], capture_output=True, text=True,
                         timeout=1500, cwd=Path(__file__).parents[2], env=environment)
    assert run.returncode == 0, run.stderr[-3000:]
    builds = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    print(*builds, sep="\n")
    return builds


@pytest.mark.slow
def test_the_kernels_build_for_an_h100_within_its_shared_memory_without_spills(sm90_builds):
    # Valid sm_90 programs whose blocks fit in shared memory, and (in bfloat16 and float16) whose
    # values stay in registers: a spill's stack traffic would add to the scores' own.
    assert {build["kernel"] for build in sm90_builds} == {
        "attention_forward", "attention_backward", "talking_heads_forward", "talking_heads_backward"}
    for build in sm90_builds:
        assert build["shared"] <= H100_SHARED_MEMORY, build
    spill_free = [build for build in sm90_builds if build["must_not_spill"]]
    assert {(build["kernel"], build["dtype"]) for build in spill_free} >= {
        ("attention_forward", "bfloat16"), ("attention_backward", "bfloat16"), ("attention_forward", "float16"),
        ("talking_heads_forward", "bfloat16"), ("talking_heads_backward", "bfloat16")}
    for build in spill_free:
        assert build["stack"] == 0, build


@pytest.mark.slow
def test_the_talking_heads_kernels_keep_their_values_in_registers(sm90_builds):
    # They read one head's [16, d] tiles at a time: no [h, 16, d] tile but the forward's context.
    talking = [build for build in sm90_builds if build["kernel"].startswith("talking_heads")
               and build["dtype"] != "float32"]
    assert {build["kernel"] for build in talking} == {"talking_heads_forward", "talking_heads_backward"}
    for build in talking:
        assert build["must_not_spill"] and build["stack"] == 0, build


@pytest.mark.slow  # (a fresh interpreter imports torch and transformers)
def test_importing_the_gpu_attention_imports_no_triton():
    # (Where Triton is installed, importing transformers' modeling_utils imports it: torch._dynamo does.)
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
        TritonSoftmax.apply(*arguments(ops))


def test_operands_that_do_not_fit_together_are_refused(triton_kernels):
    *inputs, settings = arguments(operands(Case("global")))
    with pytest.raises(ValueError, match="relative terms and their ids come together: relative given, "
                                         "kernel_ids None"):
        TritonSoftmax.apply(*inputs, replace(settings, kernel_ids=None))
    narrow = settings.mask_bias[..., :-1]
    with pytest.raises(ValueError, match=r"mask_bias has 24 keys per query, the keys give 25 \(first piece 5, "
                                         r"second 20\)"):
        TritonSoftmax.apply(*inputs, replace(settings, mask_bias=narrow, kernel_ids=settings.kernel_ids[..., :-1]))


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU tensors outside the interpreter")
def test_cpu_tensors_outside_the_interpreter_are_refused(triton_kernels, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    ops = operands(Case("global"))
    with pytest.raises(ValueError, match="take CUDA tensors, not cpu ones"):
        TritonSoftmax.apply(*arguments(ops))
