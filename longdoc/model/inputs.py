"""Checks of GlobalLocalModel's forward arguments, done before any compute.

Every problem raises a ValueError that names the argument, the value found and the limit, so a
wrong feature pipeline fails at the door instead of deep inside a matmul (or, worse, silently).
"""

import torch
from torch import Tensor

from longdoc.model.config import GlobalLocalConfig
from longdoc.model.side_inputs import StructureIds


def _require_shape(name: str, tensor: Tensor | None, shape: tuple[int, ...]) -> None:
    if tensor is not None and tuple(tensor.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {shape}")


def _require_range(name: str, tensor: Tensor | None, low: int, high: int, what: str) -> None:
    """All values in [low, high)."""
    if tensor is None or tensor.numel() == 0:
        return
    smallest, largest = int(tensor.min()), int(tensor.max())
    if smallest < low or largest >= high:
        bad = smallest if smallest < low else largest
        raise ValueError(f"{name} contains {bad}, outside [{low}, {high - 1}] ({what})")


def _require_integer(name: str, tensor: Tensor | None) -> None:
    if tensor is not None and (tensor.is_floating_point() or tensor.is_complex()):
        raise ValueError(f"{name} must hold integers, got dtype {tensor.dtype}")


def check_and_collect(
    config: GlobalLocalConfig,
    long_input_ids: Tensor,
    global_input_ids: Tensor | None,
    long_attention_mask: Tensor | None,
    global_attention_mask: Tensor | None,
    long_token_type_ids: Tensor | None,
    global_token_type_ids: Tensor | None,
    sentence_ids: Tensor | None,
    mention_ids: Tensor | None,
    long_paragraph_ids: Tensor | None,
    global_paragraph_ids: Tensor | None,
    global_sees_all: Tensor | None,
    global_features: Tensor | None,
) -> StructureIds:
    """Validate every argument; return the structure record with defaults filled in."""
    if long_input_ids is None or long_input_ids.dim() != 2:
        shape = None if long_input_ids is None else tuple(long_input_ids.shape)
        raise ValueError(f"long_input_ids must be a [batch, length] tensor, got shape {shape}")
    batch, length = long_input_ids.shape
    if length == 0:
        raise ValueError("long_input_ids has length 0; at least one long token is needed")
    if length > config.long_max_len:
        raise ValueError(f"long_input_ids has length {length}, above long_max_len = {config.long_max_len}")
    if global_input_ids is None:
        num_globals = 0
        for name, value in (("global_attention_mask", global_attention_mask),
                            ("global_token_type_ids", global_token_type_ids),
                            ("global_paragraph_ids", global_paragraph_ids),
                            ("global_sees_all", global_sees_all), ("global_features", global_features)):
            if value is not None:
                raise ValueError(f"{name} was given but global_input_ids is None (no global tokens)")
    else:
        if global_input_ids.dim() != 2 or global_input_ids.shape[0] != batch:
            raise ValueError(
                f"global_input_ids has shape {tuple(global_input_ids.shape)}, expected [{batch}, num_globals]"
            )
        num_globals = global_input_ids.shape[1]
        if num_globals > config.global_max_len:
            raise ValueError(
                f"global_input_ids has {num_globals} global tokens, above global_max_len = {config.global_max_len}"
            )

    long_shape, global_shape = (batch, length), (batch, num_globals)
    for name, tensor, shape in (
        ("long_attention_mask", long_attention_mask, long_shape),
        ("long_token_type_ids", long_token_type_ids, long_shape),
        ("sentence_ids", sentence_ids, long_shape),
        ("mention_ids", mention_ids, long_shape),
        ("long_paragraph_ids", long_paragraph_ids, long_shape),
        ("global_attention_mask", global_attention_mask, global_shape),
        ("global_token_type_ids", global_token_type_ids, global_shape),
        ("global_paragraph_ids", global_paragraph_ids, global_shape),
        ("global_sees_all", global_sees_all, global_shape),
    ):
        _require_shape(name, tensor, shape)
    if global_features is not None:
        if config.global_feature_size == 0:
            raise ValueError("global_features was given but config.global_feature_size is 0")
        _require_shape("global_features", global_features, (batch, num_globals, config.global_feature_size))
    for name, tensor in (("long_input_ids", long_input_ids), ("global_input_ids", global_input_ids),
                         ("long_token_type_ids", long_token_type_ids),
                         ("global_token_type_ids", global_token_type_ids), ("sentence_ids", sentence_ids),
                         ("mention_ids", mention_ids), ("long_paragraph_ids", long_paragraph_ids),
                         ("global_paragraph_ids", global_paragraph_ids)):
        _require_integer(name, tensor)
    vocab = f"vocab_size = {config.vocab_size}"
    _require_range("long_input_ids", long_input_ids, 0, config.vocab_size, vocab)
    _require_range("global_input_ids", global_input_ids, 0, config.vocab_size, vocab)
    types = f"type_vocab_size = {config.type_vocab_size}"
    _require_range("long_token_type_ids", long_token_type_ids, 0, config.type_vocab_size, types)
    _require_range("global_token_type_ids", global_token_type_ids, 0, config.type_vocab_size, types)
    links = f"an index of one of the {num_globals} global tokens, or -1 for none"
    _require_range("sentence_ids", sentence_ids, -1, num_globals, links)
    _require_range("mention_ids", mention_ids, -1, num_globals, links)
    if mention_ids is not None and sentence_ids is None:
        raise ValueError("mention_ids was given without sentence_ids")

    device = long_input_ids.device
    long_mask = (long_attention_mask != 0) if long_attention_mask is not None else torch.ones(
        long_shape, dtype=torch.bool, device=device
    )
    global_mask = (global_attention_mask != 0) if global_attention_mask is not None else torch.ones(
        global_shape, dtype=torch.bool, device=device
    )
    for name, links in (("sentence_ids", sentence_ids), ("mention_ids", mention_ids)):
        if links is not None and num_globals > 0:
            # A real long token linked to a padding global token: the link points to no token.
            target_is_padding = ~global_mask.gather(1, links.clamp(min=0)) & (links >= 0) & long_mask
            if bool(target_is_padding.any()):
                example, position = (int(i) for i in target_is_padding.nonzero()[0])
                raise ValueError(
                    f"{name}[{example}, {position}] = {int(links[example, position])} points to a padding global "
                    f"token (global_attention_mask is 0 there)"
                )
    return StructureIds(
        long_mask=long_mask,
        global_mask=global_mask,
        sentence_ids=sentence_ids,
        mention_ids=mention_ids,
        long_paragraph_ids=long_paragraph_ids,
        global_paragraph_ids=global_paragraph_ids,
        global_sees_all=None if global_sees_all is None else global_sees_all.bool(),
    )
