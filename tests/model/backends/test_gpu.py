"""The gpu backend's adapter (longdoc.model.backends.gpu) against its contract, without a GPU: a
stand-in for the kernel module's `attention`, written here in plain torch from the contract alone
(the keyword operands of the C++ entry points; outputs returned), takes the adapter's place of the
Triton kernel, and the model then equals the dense float64 reference, outputs and gradients."""

import pytest
import torch
import torch.nn.functional as F

from longdoc.model.backends import gpu
from tests.model.conftest import make_inputs, tiny_config
from tests.model.dense_reference import dense_forward
from tests.model.test_attention import make_model


def contract_attention(*, query, query_scale, first_keys, first_values, window_block, second_keys, second_values,
                       relative, ids, carried, mask_bias, scale, pre, post, key_ranges, drop_probability,
                       keep_summed, keep_weights):
    """What the kernel module's attention() computes, by its docstring: views [B, h, N, d]; relative
    [B, h, Nq, R], ids (int32) and mask_bias [B, Nq, N]; returns (context [B, Nq, H], summed, weights)."""
    assert key_ranges is None and drop_probability == 0.0 and (ids is None or ids.dtype == torch.int32)
    batch, heads, num_queries, size = query.shape
    if window_block:  # each block of b queries: the 3b first keys around it (zeros beyond the ends)
        b = window_block
        windows = lambda rows: F.pad(rows, (0, 0, b, b)).unfold(2, 3 * b, b).transpose(-1, -2)  # [B, h, nb, 3b, d]
        blocks = query.unflatten(2, (-1, b))
        first = torch.einsum("bhnqd,bhnkd->bhnqk", blocks, windows(first_keys)).flatten(2, 3)
    else:
        first = query @ first_keys.transpose(-1, -2)
    summed = query_scale * torch.cat([first, query @ second_keys.transpose(-1, -2)], dim=-1)  # [B, h, Nq, N]
    if relative is not None:
        summed = summed + relative.gather(-1, ids.long().unsqueeze(1).expand(summed.shape))
    if carried is not None:
        summed = summed + carried
    logits = summed if pre is None else torch.einsum("gh,bhqk->bgqk", pre, summed)
    probs = torch.softmax(scale * logits + mask_bias.unsqueeze(1), dim=-1)
    weights = probs if post is None else torch.einsum("gh,bhqk->bgqk", post, probs)
    first_part, second_part = weights[..., :weights.shape[-1] - second_keys.shape[2]], weights[..., -second_keys.shape[2]:]
    if window_block:
        context = torch.einsum("bhnqk,bhnkd->bhnqd", first_part.unflatten(2, (-1, b)), windows(first_values))
        context = context.flatten(2, 3)
    else:
        context = first_part @ first_values
    context = context + second_part @ second_values
    return (context.transpose(1, 2).reshape(batch, num_queries, heads * size), summed if keep_summed else None,
            probs if keep_weights else None)


@pytest.fixture
def stand_in_kernel(monkeypatch):
    """The gpu backend runs here, on the CPU, with the stand-in as its kernel."""
    monkeypatch.setattr(gpu, "kernel_module", lambda: (type("Kernel", (), {"attention": staticmethod(contract_attention)}),
                                                       None))
    monkeypatch.setattr(gpu.GpuBackend, "refusal", classmethod(lambda cls, device, dtype: None))


@pytest.mark.parametrize("overrides", [dict(residual_attention=True), dict(talking_heads=True),
                                       dict(cross_kv_projections=True, residual_attention_mean=True)],
                         ids=["residual", "talking-heads", "cross-kv,running-mean"])
def test_a_kernel_that_keeps_the_contract_makes_the_gpu_backend_equal_the_reference(stand_in_kernel, overrides):
    model = make_model(tiny_config(**overrides))
    model.set_attention_backend("gpu")
    inputs = make_inputs(2, 13, 4, padding=True, structure=True, packed=True)
    long_mask, global_mask = inputs["long_attention_mask"].bool(), inputs["global_attention_mask"].bool()
    output = model(**inputs)
    reference_model = make_model(tiny_config(**overrides))
    long_reference, global_reference = dense_forward(reference_model, inputs)
    torch.testing.assert_close(output.long_hidden_state[long_mask], long_reference[long_mask], atol=1e-10, rtol=0)
    torch.testing.assert_close(output.global_hidden_state[global_mask], global_reference[global_mask], atol=1e-10,
                               rtol=0)
    weights = torch.randn(2, 13, 16, dtype=torch.float64), torch.randn(2, 4, 16, dtype=torch.float64)
    for long_hidden, global_hidden in ((output.long_hidden_state, output.global_hidden_state),
                                       (long_reference, global_reference)):
        ((long_hidden * weights[0])[long_mask].sum() + (global_hidden * weights[1])[global_mask].sum()).backward()
    for (name, got), expected in zip(model.named_parameters(), reference_model.parameters()):
        assert (got.grad is None) == (expected.grad is None), name
        if expected.grad is not None:
            torch.testing.assert_close(got.grad, expected.grad, atol=1e-9, rtol=1e-7, msg=name)
