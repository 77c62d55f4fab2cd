"""A float32 model's parameter gradients (the blocked attention, on the backend it picks) against the
float64 dense reference's (dense_reference.py), for one loss over the real long and global tokens."""

import torch

from tests.model.conftest import tiny_config
from tests.model.dense_reference import dense_forward
from tests.model.test_attention import make_model


def assert_gradients_equal_dense(overrides: dict, inputs: dict, weights: tuple, parameter: str) -> None:
    """The gradients of sum(long hidden * weights[0]) + sum(global hidden * weights[1]) over the real
    tokens, of a float32 model of tiny_config(**overrides) and of the float64 dense reference, name by
    name (atol 1e-4, rtol 1e-3); some parameter's name holds `parameter` (its gradient was computed)."""
    long_mask, global_mask = inputs["long_attention_mask"].bool(), inputs["global_attention_mask"].bool()

    def gradients(model, forward) -> dict:
        long_hidden, global_hidden = forward(model)
        loss = ((long_hidden.double() * weights[0])[long_mask].sum()
                + (global_hidden.double() * weights[1])[global_mask].sum())
        loss.backward()
        return {name: p.grad.double() for name, p in model.named_parameters() if p.grad is not None}

    def blocked(model):
        output = model(**inputs)
        return output.long_hidden_state, output.global_hidden_state

    got = gradients(make_model(tiny_config(**overrides)).float(), blocked)
    expected = gradients(make_model(tiny_config(**overrides)), lambda model: dense_forward(model, inputs))
    assert got.keys() == expected.keys()
    assert any(parameter in name for name in got)
    for name in got:
        torch.testing.assert_close(got[name], expected[name], atol=1e-4, rtol=1e-3, msg=name)
