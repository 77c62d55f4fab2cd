"""What `keep_attention_weights` keeps beside the weights: each softmax's mask, and under residual
attention the carried scores each layer received and the summed scores it passed on, on every backend
that returns weights, pair by pair against the dense float64 reference (tests/model/dense_reference.py);
keeping them changes no output."""

import pytest
import torch

from tests.model.backends.test_backends import mask_biases, model_on
from tests.model.conftest import make_inputs, tiny_config
from tests.model.dense_reference import DenseLayerAttention, dense_forward
from tests.model.test_attention import make_model

TOLERANCE = {"eager": 1e-10, "dense": 1e-10, "cpu": 2e-5}
# How far keeping the weights may move the outputs: not at all, but in the C++ kernels, whose path that
# writes the weights out rounds differently in float32.
UNCHANGED = {"eager": 0.0, "dense": 0.0, "cpu": 1e-6}
CONFIGS = {
    "residual": dict(residual_attention=True),
    "running-mean": dict(residual_attention=True, residual_attention_mean=True),
    "talking-heads": dict(residual_attention=True, talking_heads=True),
    "plain": dict(residual_attention=False),
}


def dense_in_blocks(dense: torch.Tensor, length: int, num_globals: int, block_size: int,
                    num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, h, N, N] over [long | global] (N = L + G) -> the blocked layout the model keeps: long [B, h,
    nb, b, 3b + G] and global [B, h, G, G + Lp], NaN where the cell is no pair of real tokens (a window
    key beyond the ends, a query or key in the padding of the last block)."""
    b, n = block_size, length + num_globals
    padded = torch.nn.functional.pad(dense, (0, 1, 0, 1), value=float("nan"))  # row and column n: no token
    query = torch.arange(num_blocks * b).view(num_blocks, b, 1)
    window_key = (torch.arange(num_blocks).view(-1, 1, 1) - 1) * b + torch.arange(3 * b)  # [nb, 1, 3b]
    long_columns = torch.cat([window_key.expand(num_blocks, b, 3 * b),
                              (length + torch.arange(num_globals)).expand(num_blocks, b, num_globals)], dim=-1)
    long_columns = torch.where((long_columns >= 0) & (long_columns < n) & (query < length), long_columns, n)
    long_rows = torch.where(query < length, query, n).expand_as(long_columns)
    global_columns = torch.cat([length + torch.arange(num_globals), torch.arange(num_blocks * b)])
    global_columns = torch.where(torch.arange(global_columns.numel()) >= num_globals + length, n, global_columns)
    long_blocked = padded[:, :, long_rows, long_columns]
    global_blocked = padded[:, :, length:n][:, :, :, global_columns]
    return long_blocked, global_blocked


def assert_same_on_allowed_pairs(got: torch.Tensor, dense_blocked: torch.Tensor, mask_bias: torch.Tensor,
                                 tolerance: float) -> None:
    pairs = (mask_bias == 0).expand_as(got) & ~dense_blocked.isnan()
    assert pairs.sum() > 0
    torch.testing.assert_close(got[pairs].double(), dense_blocked[pairs], atol=tolerance, rtol=0)


@pytest.mark.parametrize("backend", list(TOLERANCE))
@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("grad_enabled", [False, True], ids=["no-grad", "grad"])
def test_kept_scores_and_masks_equal_the_dense_references(backend, overrides, grad_enabled):
    inputs = make_inputs(2, 17, 6, padding=True, structure=True)
    model = model_on(backend, overrides)
    with torch.set_grad_enabled(grad_enabled):
        plain = model(**inputs)
        model.keep_attention_weights()
        kept = model(**inputs)
    # Keeping them changes nothing the model computes.
    for got, before in ((kept.long_hidden_state, plain.long_hidden_state),
                        (kept.global_hidden_state, plain.global_hidden_state)):
        torch.testing.assert_close(got, before, atol=UNCHANGED[backend], rtol=0)

    record: list[DenseLayerAttention] = []
    dense_forward(make_model(tiny_config(**overrides)), inputs, record)
    long_mask, global_mask = mask_biases(model.config, inputs)
    residual = overrides["residual_attention"]
    for number, (layer, reference) in enumerate(zip(kept.attention_weights, record, strict=True), start=1):
        assert torch.equal(layer.long_mask_bias == 0, long_mask == 0)
        assert torch.equal(layer.global_mask_bias == 0, global_mask == 0)
        if not residual:
            assert layer.carried is None and layer.summed is None
            continue
        blocks = (17, 6, layer.block_size, layer.long.shape[2])
        for kept_scores, dense_scores in ((layer.summed, reference.summed), (layer.carried, reference.carried)):
            if dense_scores is None:  # the first layer receives nothing
                assert number == 1 and kept_scores.long_scores is None and kept_scores.global_scores is None
                continue
            long_dense, global_dense = dense_in_blocks(dense_scores, *blocks)
            assert_same_on_allowed_pairs(kept_scores.long_scores, long_dense, long_mask, TOLERANCE[backend])
            assert_same_on_allowed_pairs(kept_scores.global_scores, global_dense, global_mask, TOLERANCE[backend])


def test_dense_in_blocks_places_the_pairs_as_the_weights_lie():
    # The mapping above against the weights the dense backend keeps (its own placement of the pairs).
    inputs = make_inputs(2, 17, 6, padding=True, structure=True)
    model = model_on("dense", {})
    model.keep_attention_weights()
    layer = model(**inputs).attention_weights[0]
    record: list[DenseLayerAttention] = []
    dense_forward(make_model(tiny_config()), inputs, record)
    long_mask, global_mask = mask_biases(model.config, inputs)
    long_dense, global_dense = dense_in_blocks(record[0].probs, 17, 6, layer.block_size, layer.long.shape[2])
    assert_same_on_allowed_pairs(layer.long, long_dense, long_mask, 1e-10)
    assert_same_on_allowed_pairs(layer.global_, global_dense, global_mask, 1e-10)
