"""The relative terms' gradient (longdoc.model.backends.relative) against its definition: each pair's
gradient added to its id's entry, a scatter-add over every pair, in float64."""

import pytest
import torch

from longdoc.model.backends.relative import relative_gradient
from longdoc.model.side_inputs import RelativeIdLayout, local_relative_ids


def long_query_ids(block_size: int, layout: RelativeIdLayout, links: torch.Tensor, globals_: int) -> torch.Tensor:
    """[B, 1, nb, b, 3b + G]: the window keys' ids by distance, a global key's "linked" where the long
    query links to it (links [B, Lp, 2]: none, one, or two different global tokens; -1 for none), else
    "unlinked"."""
    batch, padded = links.shape[:2]
    blocks = padded // block_size
    window = local_relative_ids(block_size, layout).expand(batch, 1, blocks, -1, -1)
    keys = torch.arange(globals_).view(1, 1, -1)
    linked = (links[..., :1] == keys) | (links[..., 1:] == keys)  # [B, Lp, G]
    pairs = torch.where(linked, layout.linked, layout.unlinked).view(batch, 1, blocks, block_size, globals_)
    return torch.cat([window, pairs], dim=-1)


@pytest.mark.parametrize("block_size,max_distance", [(85, 12), (5, 3), (4, 12), (6, 2), (3, 3), (1, 2), (2, 1)],
                         ids=["etc-4k", "k-below-b", "k-beyond-2b", "k-small", "k-is-b", "one-token-blocks", "k-1"])
@pytest.mark.parametrize("with_links", [True, False], ids=["links", "no-links"])
def test_the_long_softmaxs_relative_gradient_is_the_scatter_add_of_each_pairs_gradient(block_size, max_distance,
                                                                                      with_links):
    generator = torch.Generator().manual_seed(block_size * 100 + max_distance)
    batch, heads, blocks, globals_ = 2, 3, 4, 5
    layout = RelativeIdLayout(max_distance)
    size = layout.size + 2  # (a model's relative vocabulary may be larger than the ids used)
    padded = blocks * block_size
    grad_picked = torch.randn(batch, heads, blocks, block_size, 3 * block_size + globals_, generator=generator,
                              dtype=torch.float64)
    links = torch.randint(-1, globals_, (batch, padded, 2), generator=generator)
    links[..., 1][links[..., 1] == links[..., 0]] = -1  # (a token's two links, when it has two, differ)
    ids = long_query_ids(block_size, layout, links, globals_)
    shape = torch.Size([batch, heads, blocks, block_size, size])
    expected = torch.zeros(shape, dtype=torch.float64).scatter_add_(-1, ids.expand(grad_picked.shape), grad_picked)
    got = relative_gradient(grad_picked, ids, links if with_links else None, layout, block_size, shape)
    if not with_links:  # every long-global pair then counts as unlinked
        expected[..., layout.unlinked] += expected[..., layout.linked]
        expected[..., layout.linked] = 0
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
