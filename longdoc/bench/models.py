"""The models the benchmark compares, randomly initialised with one shared shape, and their inputs.

Token counts: our encoder reads L long tokens plus G global tokens (G = shape.global_tokens). In
the fresh-process run each peer reads one sequence of L + G tokens, so that every model embeds,
projects and feeds forward the same number of token positions; in the plain-process run each
peer reads the same L-token document, as a user would give it. For Longformer the first G tokens get global attention (its global_attention_mask), which is
ETC's global-local pattern in one sequence. Longformer pads the sequence to a multiple of its window
itself; that padding is part of its cost. BigBird's and BERT's inputs need no padding (L and L + G
are multiples of 64 at every benchmark length).
Dropout is 0 everywhere, so train mode differs from eval mode only in what autograd keeps.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from longdoc.bench.settings import BERT, BIGBIRD, LONGFORMER, OURS, Job

# Token ids are drawn above the special ids (padding is 0 for BERT and BigBird, 1 for Longformer)
# so that no model mistakes a random token for padding.
FIRST_ORDINARY_TOKEN_ID = 5


@dataclass
class Runner:
    """A model, its inputs and the training loss: the sum of every output the model returns."""

    model: torch.nn.Module
    inputs: dict
    loss: Callable[[object], torch.Tensor]


def _random_ids(shape, length: int) -> torch.Tensor:
    return torch.randint(FIRST_ORDINARY_TOKEN_ID, shape.vocab_size, (1, length))


def _shared_sizes(shape) -> dict:
    """The config fields every model (ours and transformers') spells the same way."""
    return dict(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        intermediate_size=shape.intermediate_size,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def _peer_tokens(job: Job) -> int:
    return job.length + job.settings.peer_tokens_extra


def _last_hidden_state_sum(output) -> torch.Tensor:
    return output.last_hidden_state.sum()


# Each builder imports its own model's module, so that a measuring process loads only what it runs.
def _ours(job: Job) -> Runner:
    from longdoc import GlobalLocalConfig, GlobalLocalModel
    from longdoc.model.inference import compile_model

    shape, length = job.settings.shape, job.length
    config = GlobalLocalConfig(
        **_shared_sizes(shape),
        local_radius=shape.local_radius,
        long_max_len=length,
        global_max_len=shape.global_tokens,
        residual_attention=job.variant.residual_attention,
        talking_heads=job.variant.talking_heads,
        attention_backend=job.settings.attention,
    )
    # Each global token stands for a "sentence" of consecutive long tokens, as in ETC's tasks.
    sentence_ids = torch.arange(length).div(shape.tokens_per_global(length), rounding_mode="floor")
    inputs = dict(
        long_input_ids=_random_ids(shape, length),
        global_input_ids=_random_ids(shape, shape.global_tokens),
        sentence_ids=sentence_ids.unsqueeze(0),
    )

    def loss(output) -> torch.Tensor:
        return output.long_hidden_state.sum() + output.global_hidden_state.sum()

    model = GlobalLocalModel(config)
    if job.settings.compile:
        compile_model(model, torch.device(job.settings.device))
    return Runner(model, inputs, loss)


def _longformer(job: Job) -> Runner:
    from transformers import LongformerConfig, LongformerModel

    shape, window = job.settings.shape, job.settings.longformer_window
    tokens = _peer_tokens(job)
    padded = -(-tokens // window) * window
    # RoBERTa-style positions start after the padding id, hence the extra entries.
    config = LongformerConfig(
        **_shared_sizes(shape), attention_window=window, pad_token_id=1, max_position_embeddings=padded + 2,
    )
    global_attention_mask = torch.zeros(1, tokens, dtype=torch.long)
    global_attention_mask[:, : shape.global_tokens] = 1
    inputs = dict(input_ids=_random_ids(shape, tokens), global_attention_mask=global_attention_mask)
    return Runner(LongformerModel(config, add_pooling_layer=False), inputs, _last_hidden_state_sum)


def _bigbird(job: Job) -> Runner:
    from transformers import BigBirdConfig, BigBirdModel

    shape, settings = job.settings.shape, job.settings
    tokens = _peer_tokens(job)
    config = BigBirdConfig(
        **_shared_sizes(shape),
        attention_type="block_sparse",
        block_size=settings.bigbird_block_size,
        num_random_blocks=settings.bigbird_random_blocks,
        max_position_embeddings=tokens,
    )
    inputs = dict(input_ids=_random_ids(shape, tokens))
    return Runner(BigBirdModel(config, add_pooling_layer=False), inputs, _last_hidden_state_sum)


def _bert(job: Job) -> Runner:
    from transformers import BertConfig, BertModel

    shape = job.settings.shape
    tokens = _peer_tokens(job)
    config = BertConfig(**_shared_sizes(shape), max_position_embeddings=tokens, attn_implementation="sdpa")
    # No attention mask: SDPA then takes its fused path, with memory linear in length.
    inputs = dict(input_ids=_random_ids(shape, tokens))
    return Runner(BertModel(config, add_pooling_layer=False), inputs, _last_hidden_state_sum)


_BUILDERS = {OURS: _ours, LONGFORMER: _longformer, BIGBIRD: _bigbird, BERT: _bert}


def build_runner(job: Job) -> Runner:
    """The job's model at random initialisation (seeded), moved to its device and dtype, with inputs."""
    torch.manual_seed(job.settings.seed)
    runner = _BUILDERS[job.variant.family](job)
    device = torch.device(job.settings.device)
    runner.model.to(device=device, dtype=getattr(torch, job.settings.dtype))
    runner.inputs = {name: tensor.to(device) for name, tensor in runner.inputs.items()}
    return runner
