"""The kernels' own products where they copy B's blocks of columns first (products.cpp, kCopyBFromRows:
more than 128 rows of C, at AVX2): the backward's gradients of keys and values over windows of more
than 128 keys, and of the long keys of global queries, against the float64 dense reference."""

import pytest
import torch

from longdoc.model.kernels import cpu as kernels
from tests.model.conftest import make_inputs
from tests.model.dense_gradients import assert_gradients_equal_dense


@pytest.fixture
def own_products_on(kernel):
    if not kernel.use_own_products(True):
        pytest.skip("the kernel was built with neither AVX-512 nor AVX2: its own products are not compiled")
    yield
    kernel.use_own_products(kernels.wants_own_products())


# Head sizes: below one vector (the last block's masked lanes) and a whole block of AVX2's 16 columns.
@pytest.mark.parametrize("head_size", [4, 32])
def test_gradients_over_more_than_128_keys_equal_the_dense_reference(own_products_on, head_size):
    # Blocks of 46 queries: windows of 138 keys; 150 long tokens: the global queries' long keys.
    config = dict(hidden_size=2 * head_size, num_attention_heads=2, local_radius=45, long_max_len=256,
                  max_position_embeddings=256, residual_attention=True)
    length, num_globals = 150, 6
    inputs = make_inputs(2, length, num_globals, padding=True, structure=True)
    generator = torch.Generator().manual_seed(3)
    weights = (torch.randn(2, length, 2 * head_size, generator=generator, dtype=torch.float64),
               torch.randn(2, num_globals, 2 * head_size, generator=generator, dtype=torch.float64))
    assert_gradients_equal_dense(config, inputs, weights, "qkv")
