"""The CPU dropout of longdoc.model.dropout against the rules of torch.nn.Dropout."""

import pytest
import torch

from longdoc.model.dropout import Dropout, keep_mask


def test_the_mask_drops_the_rounded_probability_in_every_lane_independently():
    torch.manual_seed(0)
    keep, realised = keep_mask(torch.Size([1_000_000, 4]), 0.1)
    assert realised == round(0.1 * 2**15) / 2**15 == 3277 / 32768
    lanes = keep.float()
    # 1e6 draws per lane: the standard error of a kept fraction is 3e-4.
    assert torch.allclose(lanes.mean(0), torch.full((4,), 1 - realised), atol=2e-3)
    # Lanes cut from one 64-bit draw are independent: neighbouring lanes agree as often as chance says.
    for a, b in ((0, 1), (1, 2), (2, 3), (3, 0)):
        both_kept = (lanes[:, a] * lanes[:, b]).mean()
        assert abs(float(both_kept) - (1 - realised) ** 2) < 2e-3


def test_kept_elements_are_scaled_so_the_expectation_holds_and_gradients_follow_the_mask():
    torch.manual_seed(1)
    dropout = Dropout(0.25).train()
    x = torch.rand(400, 1000, requires_grad=True)
    y = dropout(x)
    kept = y != 0
    assert torch.allclose(y[kept], x.detach()[kept] / 0.75)
    assert abs(float(kept.float().mean()) - 0.75) < 3e-3
    y.sum().backward()
    assert torch.equal(x.grad, kept.float() / 0.75)


def test_seeded_runs_draw_the_same_mask_and_evaluation_is_the_identity():
    x = torch.randn(3, 5, 7)
    dropout = Dropout(0.5).train()
    torch.manual_seed(7)
    first = dropout(x)
    torch.manual_seed(7)
    assert torch.equal(dropout(x), first)
    assert not torch.equal(dropout(x), first)  # the generator moved on
    assert torch.equal(dropout.eval()(x), x)


@pytest.mark.parametrize("probability", [0.0, 1.0])
def test_the_edges_are_torchs(probability):
    x = torch.randn(6, 9, requires_grad=True)
    y = Dropout(probability).train()(x)
    assert torch.equal(y, x if probability == 0.0 else torch.zeros_like(x))
    y.sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 1.0 - probability))
