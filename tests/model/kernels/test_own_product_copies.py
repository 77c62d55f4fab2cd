"""The kernels' own products where they copy B's blocks of columns first (products.cpp, kCopyBFromRows:
more than 128 rows of C, at AVX2): the backward's gradients of keys and values over windows of more
than 128 keys, and of the long keys of global queries, against the float64 dense reference."""

import pytest
import torch

from longdoc.model.kernels import cpu as kernels
from tests.model.conftest import make_inputs, tiny_config
from tests.model.dense_reference import dense_forward
from tests.model.test_attention import make_model


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
    long_mask, global_mask = inputs["long_attention_mask"].bool(), inputs["global_attention_mask"].bool()
    generator = torch.Generator().manual_seed(3)
    weights = (torch.randn(2, length, 2 * head_size, generator=generator, dtype=torch.float64),
               torch.randn(2, num_globals, 2 * head_size, generator=generator, dtype=torch.float64))

    def gradients(model, forward):
        long_hidden, global_hidden = forward(model)
        loss = ((long_hidden.double() * weights[0])[long_mask].sum()
                + (global_hidden.double() * weights[1])[global_mask].sum())
        loss.backward()
        return {name: parameter.grad.double() for name, parameter in model.named_parameters()
                if parameter.grad is not None}

    def blocked(model):
        output = model(**inputs)
        return output.long_hidden_state, output.global_hidden_state

    kernel_gradients = gradients(make_model(tiny_config(**config)).float(), blocked)
    dense_gradients = gradients(make_model(tiny_config(**config)), lambda model: dense_forward(model, inputs))
    assert kernel_gradients.keys() == dense_gradients.keys()
    assert any("qkv" in name for name in kernel_gradients)
    for name in kernel_gradients:
        torch.testing.assert_close(kernel_gradients[name], dense_gradients[name], atol=1e-4, rtol=1e-3, msg=name)
