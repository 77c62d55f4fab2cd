"""Structure ids -> attention masks and relative position ids, in the shapes the attention uses.

ETC (Ainslie et al., 2020, section 2) builds every mask and relative id from a few per-token ids
("structure is data"). This module does the same, once per forward pass, as pure functions; every
layer then reads the same `SideInputs` record.

Layout (b tokens per block, `blocks_for`: r + 1, or L when L is shorter; nb = ceil(L / b) blocks,
Lp = nb * b, W = 3b):
- the long softmax: query block n, query p in the block, key c in [prev block | own | next | G
  globals]: masks and ids of shape [B, 1, nb, b, W + G] (the 1 broadcasts over heads);
- the global softmax: global query g, key in [G globals | Lp long tokens]: [B, 1, G, G + Lp].

Relative ids (`RelativeIdLayout`), with k = max_relative_distance:
  0..k        long key j at distance j - i = 0..k to the right of query i (clipped at k),
  k+1..2k     distance 1..k to the left (clipped),
  2k+1        long-global pair that is linked (the long token belongs to or mentions the global one),
  2k+2        long-global pair that is not linked,
  2k+3        two global tokens in different paragraphs (g2g uses clipped distances otherwise).
Within the long softmax the first W key columns are the local window, whose ids depend only on the
query's and key's places in the block (`local_relative_ids`), and the last G are linked/unlinked
pairs; within the global softmax the first G columns are g2g ids and the last Lp linked/unlinked
pairs. A long token links to at most two global tokens (`links`: its sentence and the candidate it
mentions). The attention's gradient of the relative terms uses this structure
(longdoc.model.backends.relative).

These are backend-neutral: masks in the compute dtype, ids as int64. What a backend needs besides
(the C++ kernels' int32 ids, the ranges of keys they skip) it derives itself, once per forward pass.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class RelativeIdLayout:
    """ETC's relative position ids for distances clipped at `max_distance` (k)."""

    max_distance: int

    def right(self, distance):
        """The id of a key `distance` places to the right, 0 <= distance <= k (k: k or more), an int or a tensor."""
        return distance

    def left(self, distance):
        """The id of a key `distance` places to the left, 1 <= distance <= k (k: k or more), an int or a tensor."""
        return self.max_distance + distance

    @property
    def right_clipped(self) -> int:
        """Keys k or more places to the right."""
        return self.right(self.max_distance)

    @property
    def left_clipped(self) -> int:
        """Keys k or more places to the left."""
        return self.left(self.max_distance)

    @property
    def linked(self) -> int:
        return 2 * self.max_distance + 1

    @property
    def unlinked(self) -> int:
        return 2 * self.max_distance + 2

    @property
    def other_paragraph(self) -> int:
        return 2 * self.max_distance + 3

    @property
    def size(self) -> int:
        """Ids used; a model's relative vocabulary may be larger."""
        return 2 * self.max_distance + 4

    def distance_ids(self, delta: Tensor) -> Tensor:
        """Ids of signed distances `delta` = key - query: 0..k right, k+1..2k left (clipped)."""
        k = self.max_distance
        return torch.where(delta >= 0, self.right(delta.clamp(0, k)), self.left((-delta).clamp(1, k)))


@dataclass
class StructureIds:
    """The per-token structure of a batch, as given to the model (see GlobalLocalModel.forward).

    long_mask [B, L] bool, global_mask [B, G] bool: real tokens (not padding).
    sentence_ids [B, L] int64: the global token each long token belongs to, -1 for none.
    mention_ids [B, L] int64 or None: a second linked global token (a candidate mention), -1 for none.
    long_paragraph_ids [B, L], global_paragraph_ids [B, G] int64 or None: paragraph of each token.
    global_sees_all [B, G] bool: global tokens exempt from hard g2l (CLS, question, candidates).
    long_example_ids [B, L], global_example_ids [B, G] int64 or None: the example each token belongs
    to, for rows that pack several (ETC's pretraining packs documents): no attention across examples.
    """

    long_mask: Tensor
    global_mask: Tensor
    sentence_ids: Tensor | None
    mention_ids: Tensor | None
    long_paragraph_ids: Tensor | None
    global_paragraph_ids: Tensor | None
    global_sees_all: Tensor | None
    long_example_ids: Tensor | None = None
    global_example_ids: Tensor | None = None


@dataclass
class SideInputs:
    """Additive masks (0 or a large negative value) and relative ids for both softmaxes."""

    block_size: int
    num_blocks: int
    long_mask_bias: Tensor  # [B, 1, nb, b, W + G], compute dtype
    global_mask_bias: Tensor | None  # [B, 1, G, G + Lp]; None when G = 0
    long_relative_ids: Tensor | None  # [B, 1, nb, b, W + G] int64; None without relative positions
    global_relative_ids: Tensor | None  # [B, 1, G, G + Lp] int64
    relative_layout: RelativeIdLayout | None = None
    links: Tensor | None = None  # [B, Lp, 2] int64: the global tokens each long token links to, -1 for none

    @property
    def padded_length(self) -> int:
        return self.block_size * self.num_blocks


def blocks_for(local_radius: int, length: int) -> tuple[int, int]:
    """(b, nb): the long tokens per block and the blocks for an input of `length`. b is r + 1, so that
    a block and its two neighbours cover every window, or the length when it is shorter, so that
    short inputs under a large radius (readers with r = 383, converted BERTs with r = 512) do not pay
    for r + 1 positions: a Python int of the input's static shape, never a read of a tensor, which
    torch.compile guards on (it compiles once per side of r + 1). While torch.export traces the
    model, b is r + 1 and nb at least 2 whatever the example's length: the exported program then
    serves every length up to long_max_len, shorter inputs padded to two blocks (a length that
    might be one block, or a view of the padded input, would tie the program to a range of lengths)."""
    if torch.compiler.is_exporting():
        # (length + r) // (r + 1), not -(-length // (r + 1)): ONNX's integer Div truncates, so the
        # exporter's floor division of a negative length rounds toward zero, a block short.
        return local_radius + 1, torch.sym_max(2, (length + local_radius) // (local_radius + 1))
    block_size = min(local_radius + 1, length)
    return block_size, -(-length // block_size)


def _window_distances(block_size: int, device=None) -> Tensor:
    """[b, 3b]: the distance from query p of a block to key c of its window [previous | own | next
    block], c - b - p, the same for every block."""
    query = torch.arange(block_size, device=device).view(-1, 1)
    return torch.arange(3 * block_size, device=device) - block_size - query


def local_relative_ids(block_size: int, layout: RelativeIdLayout, device=None) -> Tensor:
    """[b, 3b]: the id of query p of a block and key c of its window [previous | own | next block]."""
    return layout.distance_ids(_window_distances(block_size, device))


def _windows(per_token: Tensor, block_size: int, num_blocks: int, fill) -> Tensor:
    """[B, L] per-token values -> [B, nb, 3b]: for each block, the values of its window keys
    (previous, own and next block), with `fill` beyond the ends of the input."""
    batch, length = per_token.shape
    padded = per_token.new_full((batch, (num_blocks + 2) * block_size), fill)
    padded[:, block_size : block_size + length] = per_token
    return padded.unfold(1, 3 * block_size, block_size)


def build_side_inputs(
    structure: StructureIds,
    *,
    local_radius: int,
    max_relative_distance: int | None,
    hard_g2l: bool,
    hard_l2g: bool,
    local_attention_within_paragraph: bool,
    dtype: torch.dtype,
) -> SideInputs:
    """Masks and relative ids for one batch, in the shapes both softmaxes use (see the module docstring).

    Hard masks need links: without `sentence_ids` (and `mention_ids`) no long token is linked to
    any global token, so hard g2l and hard l2g are not applied (every pair may attend).

    Args:
        structure: the batch's per-token structure (masks of real tokens, sentence, mention,
            paragraph and example ids), as `check_and_collect` returns it.
        local_radius: r, the farthest a long token sees along the long input; sets the block size
            (`blocks_for`).
        max_relative_distance: k, the distance at which relative ids are clipped; None: no relative
            ids (absolute positions only).
        hard_g2l: a global token attends only to its own long tokens, unless `global_sees_all`
            marks it.
        hard_l2g: a long token attends only to its own global tokens.
        local_attention_within_paragraph: no local attention across paragraphs (where
            `long_paragraph_ids` is given).
        dtype: the compute dtype of the additive masks.

    Returns:
        SideInputs: the block layout, the additive masks `long_mask_bias` [B, 1, nb, b, W + G] and
        `global_mask_bias` [B, 1, G, G + Lp] (None without global tokens), the relative ids in the
        same shapes as int64 (None without relative positions; the global ones also without global
        tokens), their layout, and `links` [B, Lp, 2] int64 (None without relative positions or
        without `sentence_ids`).
    """
    length, num_globals = structure.long_mask.shape[1], structure.global_mask.shape[1]
    block_size, num_blocks = blocks_for(local_radius, length)
    padded_length = num_blocks * block_size
    layout = None if max_relative_distance is None else RelativeIdLayout(max_relative_distance)
    # [B, Lp, G]: long token i is linked to global token g; None (no sentence_ids): no pair is
    linked = None if structure.sentence_ids is None else _linked(structure, num_globals, padded_length)
    same_example = _same_example(structure, padded_length)
    # The long softmax: [B, 1, nb, b, W + G].
    long_allowed = _long_allowed(structure, linked, same_example, block_size, num_blocks, local_radius=local_radius,
                                 hard_l2g=hard_l2g, within_paragraph=local_attention_within_paragraph)
    long_relative_ids = None if layout is None else _long_relative_ids(structure, linked, layout, block_size,
                                                                        num_blocks)
    # The global softmax: [B, 1, G, G + Lp]; none without global tokens.
    global_mask_bias = global_relative_ids = None
    if num_globals > 0:
        global_mask_bias = _mask_bias(_global_allowed(structure, linked, same_example, padded_length, hard_g2l), dtype)
        if layout is not None:
            global_relative_ids = _global_relative_ids(structure, linked, layout, padded_length)
    return SideInputs(
        block_size=block_size,
        num_blocks=num_blocks,
        long_mask_bias=_mask_bias(long_allowed, dtype),
        global_mask_bias=global_mask_bias,
        long_relative_ids=long_relative_ids,
        global_relative_ids=global_relative_ids,
        relative_layout=layout,
        links=None if layout is None or linked is None else _links(structure, padded_length),
    )


def _linked(structure: StructureIds, num_globals: int, padded_length: int) -> Tensor:
    """[B, Lp, G] bool: long token i is linked to global token g (belongs to it or mentions it)."""
    global_index = torch.arange(num_globals, device=structure.long_mask.device)
    linked = _pad_to(structure.sentence_ids, padded_length, -1).unsqueeze(-1) == global_index
    if structure.mention_ids is not None:
        linked = linked | (_pad_to(structure.mention_ids, padded_length, -1).unsqueeze(-1) == global_index)
    return linked


def _same_example(structure: StructureIds, padded_length: int) -> Tensor | None:
    """[B, Lp, G] bool: long token i and global token g belong to one example; None: one example per row."""
    long_examples, global_examples = structure.long_example_ids, structure.global_example_ids
    if long_examples is None or global_examples is None:
        return None
    return _pad_to(long_examples, padded_length, -1).unsqueeze(-1) == global_examples.unsqueeze(1)


def _long_allowed(structure: StructureIds, linked: Tensor | None, same_example: Tensor | None, block_size: int,
                  num_blocks: int, *, local_radius: int, hard_l2g: bool, within_paragraph: bool) -> Tensor:
    """The long softmax's pairs that may attend, as a [B, nb, b, W + G] bool mask.

    The first W key columns are the keys of a query's window that are real, within its radius (and
    its paragraph under `within_paragraph`, its example in a packed row); the last G are the real
    global tokens (only its own under `hard_l2g`, of its example).

    Args:
        structure: the batch's per-token structure.
        linked [B, Lp, G] bool: long token i is linked to global token g; None: no links (no
            `sentence_ids`), so `hard_l2g` does not apply.
        same_example [B, Lp, G] bool: long token i and global token g belong to one example; None:
            one example per row.
        block_size: b, long tokens per block.
        num_blocks: nb, blocks in the padded long input (Lp = nb * b).
        local_radius: r, the farthest key a query sees within its window of W = 3b.
        hard_l2g: a long token sees only the global tokens it is linked to.
        within_paragraph: no local attention across paragraphs (where `long_paragraph_ids` is given).

    Returns:
        [B, nb, b, W + G] bool: True where query p of block n may attend to the key.
    """
    batch = structure.long_mask.shape[0]
    num_globals = structure.global_mask.shape[1]
    padded_length = num_blocks * block_size

    def queries(per_token: Tensor) -> Tensor:  # [B, L] -> [B, nb, b, 1]
        return _pad_to(per_token, padded_length, -1).view(batch, num_blocks, block_size, 1)

    def keys(per_token: Tensor, fill) -> Tensor:  # [B, L] -> [B, nb, 1, W]
        return _windows(per_token, block_size, num_blocks, fill).unsqueeze(2)

    in_radius = _window_distances(block_size, structure.long_mask.device).abs() <= local_radius  # [b, W]
    local = in_radius & keys(structure.long_mask, False)
    # Keys past the input's ends get -2, which no query's paragraph or example id (-1 on padding) equals.
    if within_paragraph and structure.long_paragraph_ids is not None:
        local = local & (queries(structure.long_paragraph_ids) == keys(structure.long_paragraph_ids, -2))
    if structure.long_example_ids is not None:
        local = local & (queries(structure.long_example_ids) == keys(structure.long_example_ids, -2))
    to_global = structure.global_mask.unsqueeze(1).expand(batch, padded_length, num_globals)
    if hard_l2g and linked is not None:
        to_global = to_global & linked
    if same_example is not None:
        to_global = to_global & same_example
    return torch.cat([local, to_global.reshape(batch, num_blocks, block_size, num_globals)], dim=-1)


def _global_allowed(structure: StructureIds, linked: Tensor | None, same_example: Tensor | None, padded_length: int,
                    hard_g2l: bool) -> Tensor:
    """[B, G, G + Lp] bool, the global softmax's pairs that may attend: the real global tokens (of its
    example in a packed row), then the real long tokens (only its own under `hard_g2l`, unless it
    sees all; of its example)."""
    batch, num_globals = structure.global_mask.shape
    to_global = structure.global_mask.unsqueeze(1).expand(batch, num_globals, num_globals)
    to_long = _pad_to(structure.long_mask, padded_length, False).unsqueeze(1).expand(batch, num_globals, padded_length)
    if hard_g2l and linked is not None:
        own_tokens = linked.transpose(1, 2)
        if structure.global_sees_all is not None:
            own_tokens = own_tokens | structure.global_sees_all.unsqueeze(-1)
        to_long = to_long & own_tokens
    if same_example is not None:
        examples = structure.global_example_ids
        to_global = to_global & (examples.unsqueeze(-1) == examples.unsqueeze(1))
        to_long = to_long & same_example.transpose(1, 2)
    return torch.cat([to_global, to_long], dim=-1)


def _long_relative_ids(structure: StructureIds, linked: Tensor | None, layout: RelativeIdLayout, block_size: int,
                       num_blocks: int) -> Tensor:
    """[B, 1, nb, b, W + G] int64: the window's distance ids (the same in every block), then linked
    or unlinked toward each global token."""
    batch, num_globals = structure.long_mask.shape[0], structure.global_mask.shape[1]
    device = structure.long_mask.device
    local = local_relative_ids(block_size, layout, device).expand(batch, num_blocks, block_size, 3 * block_size)
    shape = (batch, num_blocks, block_size, num_globals)
    to_global = _pair_ids(None if linked is None else linked.view(shape), layout, shape, device)
    return torch.cat([local, to_global], dim=-1).unsqueeze(1)


def _global_relative_ids(structure: StructureIds, linked: Tensor | None, layout: RelativeIdLayout,
                         padded_length: int) -> Tensor:
    """[B, 1, G, G + Lp] int64: clipped distances between global tokens (other_paragraph between
    paragraphs), then linked or unlinked toward each long token."""
    batch, num_globals = structure.global_mask.shape
    device = structure.global_mask.device
    position = torch.arange(num_globals, device=device)
    to_global = layout.distance_ids(position - position.view(-1, 1)).expand(batch, num_globals, num_globals)
    paragraphs = structure.global_paragraph_ids
    if paragraphs is not None:
        to_global = to_global.masked_fill(paragraphs.unsqueeze(-1) != paragraphs.unsqueeze(1), layout.other_paragraph)
    to_long = _pair_ids(None if linked is None else linked.transpose(1, 2), layout,
                        (batch, num_globals, padded_length), device)
    return torch.cat([to_global, to_long], dim=-1).unsqueeze(1)


def _pair_ids(linked: Tensor | None, layout: RelativeIdLayout, shape: tuple[int, ...], device) -> Tensor:
    """Ids of long-global pairs of `shape`: linked where `linked` (None: no pair is), else unlinked."""
    unlinked = torch.full(shape, layout.unlinked, dtype=torch.long, device=device)
    return unlinked if linked is None else unlinked.masked_fill(linked, layout.linked)


def _links(structure: StructureIds, padded_length: int) -> Tensor:
    """[B, Lp, 2] int64: the global tokens each long token links to (its sentence's, the candidate it
    mentions), -1 for none."""
    sentences, mentions = structure.sentence_ids, structure.mention_ids
    # a mention of the token's own sentence token is one link, not two
    second = torch.full_like(sentences, -1) if mentions is None else mentions.masked_fill(mentions == sentences, -1)
    return _pad_to(torch.stack([sentences, second], dim=-1), padded_length, -1)


def _pad_to(per_token: Tensor, padded_length: int, fill) -> Tensor:
    """Pad dimension 1 of [B, L, ...] to `padded_length` with `fill`. (One op whatever is missing,
    none included: a branch on it, or a tensor of its size, would tie an exported program's length
    to a multiple of the block.)"""
    missing = padded_length - per_token.shape[1]
    return F.pad(per_token, (0, 0) * (per_token.dim() - 2) + (0, missing), value=fill)


def _mask_bias(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """Bool [B, ...] -> additive [B, 1, ...]: 0 where allowed, a large negative value elsewhere.

    The value is finite (half the dtype's minimum) so that a query with no allowed key (padding)
    gives a uniform softmax instead of NaN, and adding it to any score cannot overflow.
    """
    allowed_bias = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, allowed_bias, torch.finfo(dtype).min / 2).unsqueeze(1)  # (one pass)
