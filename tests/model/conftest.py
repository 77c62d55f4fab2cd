"""Helpers shared by the encoder tests: a tiny config and random inputs with padding and structure,
and the compiled kernels' module as a fixture.

Plain functions (imported as `from tests.model.conftest import make_inputs, tiny_config`), since
tests call them with different arguments many times per test.
"""

import os

import pytest
import torch

from longdoc import GlobalLocalConfig

VOCAB = 50


def tiny_config(**overrides) -> GlobalLocalConfig:
    settings = dict(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=3, num_attention_heads=4, intermediate_size=32,
        local_radius=3, long_max_len=64, global_max_len=16, max_relative_distance=2, relative_vocab_size=8,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=64,
    )
    settings.update(overrides)
    return GlobalLocalConfig(**settings)


def make_inputs(batch: int, length: int, num_globals: int, padding: bool, structure: bool, seed: int = 1,
                packed: bool = False) -> dict:
    """Random inputs; `packed`: each row holds two examples (the first half of its long and of its
    global tokens, then the second), with example ids."""
    generator = torch.Generator().manual_seed(seed)
    inputs = {"long_input_ids": torch.randint(1, VOCAB, (batch, length), generator=generator)}
    long_mask = torch.ones(batch, length, dtype=torch.long)
    if padding and batch > 1:
        long_mask[1, max(1, length - length // 3):] = 0
    inputs["long_attention_mask"] = long_mask
    inputs["long_token_type_ids"] = torch.randint(0, 2, (batch, length), generator=generator)
    if num_globals:
        inputs["global_input_ids"] = torch.randint(1, VOCAB, (batch, num_globals), generator=generator)
        global_mask = torch.ones(batch, num_globals, dtype=torch.long)
        if padding and batch > 1 and num_globals > 1:
            global_mask[1, -1] = 0
        inputs["global_attention_mask"] = global_mask
        if structure:
            inputs["sentence_ids"] = torch.randint(-1, num_globals, (batch, length), generator=generator).sort(-1).values
            inputs["mention_ids"] = torch.where(
                torch.rand(batch, length, generator=generator) < 0.2,
                torch.randint(0, num_globals, (batch, length), generator=generator), -1,
            )
            for name in ("sentence_ids", "mention_ids"):  # real links point to real global tokens
                links = inputs[name]
                inputs[name] = torch.where(global_mask.gather(1, links.clamp(min=0)).bool(), links, -1)
            inputs["global_sees_all"] = torch.rand(batch, num_globals, generator=generator) < 0.3
            inputs["global_paragraph_ids"] = torch.randint(0, 2, (batch, num_globals), generator=generator)
    if structure:
        inputs["long_paragraph_ids"] = (torch.arange(length) * 3 // max(length, 1)).expand(batch, length).clone()
    if packed:
        inputs["long_example_ids"] = (1 + (torch.arange(length) >= length // 2)).expand(batch, length).clone()
        inputs["global_example_ids"] = (1 + (torch.arange(num_globals) >= num_globals // 2)).expand(batch, num_globals).clone()
    return inputs


@pytest.fixture
def kernel():
    """The compiled C++ kernels' module (tests/conftest.py builds it before the session's tests);
    the test is skipped where they cannot be built, and fails under CI."""
    from longdoc.model.kernels import cpu

    module = cpu.compiled()
    if module is None:
        message = f"the attention kernels could not be built here ({cpu.failure()})"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return module
