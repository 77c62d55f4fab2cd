"""One softmax of the global-local attention, as TritonSoftmax (longdoc.model.backends.gpu) takes it:
random operands with the masks and relative ids the model builds (`operands`), and a dense float64
reference of it written from DESIGN.md's rules, sections 1-3 (`reference`). The settings are the
record the gpu backend passes (longdoc.model.backends.base.KernelSettings)."""

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from longdoc.model.backends.base import KernelSettings
from longdoc.model.inputs import check_and_collect
from longdoc.model.side_inputs import build_side_inputs
from tests.model.conftest import make_inputs, tiny_config


@dataclass(frozen=True)
class Case:
    """One softmax's configuration."""

    softmax: str  # "long": blocked long queries over [window | globals]; "global": globals over [globals | long]
    relative: bool = True
    residual: bool = True  # carried scores in, summed scores out
    talking: bool = False
    cross: bool = False  # the second keys and values from a cross projection [B, N2, 2H]
    packed: bool = False  # two examples per row (example ids)
    hard: bool = True  # hard g2l and l2g
    length: int = 18  # long tokens: blocks of 4 (radius 3), the last one padded; row 1 padded from 12
    radius: int = 3
    num_globals: int = 5
    heads: int = 2
    head_size: int = 8
    scale: float = 1.0


@dataclass
class Operands:
    """TritonSoftmax's arguments (float64 leaves, for the reference; `inputs` casts them)."""

    own_qkv: Tensor
    other: Tensor
    relative: Tensor | None
    carried: Tensor | None
    pre: Tensor | None
    post: Tensor | None
    settings: KernelSettings

    def tensors(self) -> list[Tensor | None]:
        return [self.own_qkv, self.other, self.relative, self.carried, self.pre, self.post]

    def inputs(self, dtype: torch.dtype, device: str) -> list[Tensor | None]:
        """Copies in `dtype` on `device` that require grad."""
        return [None if t is None else t.detach().to(device, dtype).requires_grad_() for t in self.tensors()]

    def settings_for(self, dtype: torch.dtype, device: str) -> KernelSettings:
        s = self.settings
        mask = s.mask_bias.clamp(min=torch.finfo(dtype).min / 2).to(device, dtype)
        on_device = lambda t: None if t is None else t.to(device)
        return replace(s, mask_bias=mask, relative_ids=on_device(s.relative_ids), kernel_ids=on_device(s.kernel_ids),
                       links=on_device(s.links))

    def with_dropout(self, drop_probability: float) -> "Operands":
        return replace(self, settings=replace(self.settings, drop_probability=drop_probability))


def operands(case: Case, seed: int = 0) -> Operands:
    """Random projections, relative terms, carried scores and head mixes, with the masks and relative
    ids the model builds for random structure (sentences, mentions, paragraphs, padding)."""
    config = tiny_config(hidden_size=case.heads * case.head_size, num_attention_heads=case.heads,
                         hard_g2l=case.hard, hard_l2g=case.hard, local_attention_within_paragraph=True,
                         local_radius=case.radius, long_max_len=max(64, case.length))
    inputs = make_inputs(2, case.length, case.num_globals, padding=True, structure=True, seed=seed + 1,
                         packed=case.packed)
    side = build_side_inputs(
        check_and_collect(config, inputs), local_radius=config.local_radius,
        max_relative_distance=config.max_relative_distance, hard_g2l=config.hard_g2l, hard_l2g=config.hard_l2g,
        local_attention_within_paragraph=True, dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    random = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)
    batch, heads, hidden = 2, case.heads, case.heads * case.head_size
    long_qkv, global_qkv = random(batch, side.padded_length, 3 * hidden), random(batch, case.num_globals, 3 * hidden)
    if case.softmax == "long":
        own, other, block = long_qkv, global_qkv, side.block_size
        mask, ids = side.long_mask_bias, side.long_relative_ids
    else:
        own, other, block = global_qkv, long_qkv, 0
        mask, ids = side.global_mask_bias, side.global_relative_ids
    if case.cross:
        other = random(*other.shape[:2], 2 * hidden)
    scores_shape = (batch, heads, *mask.shape[2:])
    mixes = [torch.eye(heads, dtype=torch.float64) + 0.3 * random(heads, heads) for _ in range(2)]
    ids = ids if case.relative else None
    settings = KernelSettings(heads, block, mask, ids, None if ids is None else ids.to(torch.int32), side.links,
                              side.relative_layout, scale=case.scale, keep_summed=case.residual, keep_weights=False,
                              drop_probability=0.0, key_ranges=None, records_graph=True)
    return Operands(own, other, random(*scores_shape[:-1], config.relative_vocab_size) if case.relative else None,
                    random(*scores_shape) if case.residual else None, *(mixes if case.talking else (None, None)),
                    settings)


def reference(own_qkv: Tensor, other: Tensor, relative: Tensor | None, carried: Tensor | None, pre: Tensor | None,
              post: Tensor | None, settings: KernelSettings, keep: Tensor | None = None,
              keep_scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """One softmax, dense, per query row: its keys are those of the first piece (with a window of
    block b: keys (i - 1) b .. (i + 2) b - 1 of query block i, zero outside the input; else all), then
    all second keys. summed = q.k / sqrt(d) + relative[ids] + carried; weights = post @
    softmax(scale * (pre @ summed) + mask) (the mixes across heads), times dropout's `keep`;
    context = weights @ values. Returns (context [B, Nq, H], summed [B, h, ..., Nq, N])."""
    heads = settings.num_heads
    batch, num_queries, width3 = own_qkv.shape
    hidden, size = width3 // 3, width3 // 3 // heads
    query, first_keys, first_values = own_qkv.unflatten(-1, (3, heads, size)).permute(2, 0, 3, 1, 4)
    second_keys, second_values = other.unflatten(-1, (-1, heads, size)).permute(2, 0, 3, 1, 4)[-2:]
    b, count = settings.window_block, first_keys.shape[2]
    if b:
        index = (torch.arange(num_queries)[:, None] // b - 1) * b + torch.arange(3 * b)  # [Nq, 3b]
        inside = ((index >= 0) & (index < count)).unsqueeze(-1)
        first = [piece[:, :, index.clamp(0, count - 1)] * inside for piece in (first_keys, first_values)]
    else:
        first = [piece.unsqueeze(2).expand(-1, -1, num_queries, -1, -1) for piece in (first_keys, first_values)]
    second = [piece.unsqueeze(2).expand(-1, -1, num_queries, -1, -1) for piece in (second_keys, second_values)]
    keys, values = (torch.cat([f, s], dim=3) for f, s in zip(first, second))  # [B, h, Nq, N, d]
    summed = (query.unsqueeze(3) * keys).sum(-1) / math.sqrt(size)
    width = summed.shape[-1]
    if relative is not None:
        ids = settings.relative_ids.reshape(batch, 1, num_queries, width).expand(-1, heads, -1, -1).long()
        summed = summed + relative.reshape(batch, heads, num_queries, -1).gather(-1, ids)
    if carried is not None:
        summed = summed + carried.reshape(summed.shape)
    logits = summed if pre is None else torch.einsum("gh,bhqk->bgqk", pre, summed)
    probs = torch.softmax(settings.scale * logits + settings.mask_bias.reshape(batch, 1, num_queries, width), -1)
    weights = probs if post is None else torch.einsum("gh,bhqk->bgqk", post, probs)
    if keep is not None:
        weights = weights * keep.reshape(weights.shape) * keep_scale
    context = (weights.unsqueeze(-1) * values).sum(-2)  # [B, h, Nq, d]
    blocked = (batch, heads, *settings.mask_bias.shape[2:])
    return context.transpose(1, 2).reshape(batch, num_queries, hidden), (
        summed.reshape(blocked) if settings.keep_summed else None)
