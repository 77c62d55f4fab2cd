"""A plain dense re-computation of GlobalLocalModel: the executable spec of the blocked attention.

Every query attends over the full [long | global] key set with one [N, N] score matrix per head
(N = L + G); the window, structure and padding rules are written straight from DESIGN.md, sections
1-3, without any of the blocked layout or of longdoc.model.side_inputs. Residual attention carries the
full matrix. It reuses the model's weights (embeddings, linear layers and norms) and is meant to run
in float64 on tiny inputs.
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from longdoc import GlobalLocalModel
from longdoc.model.side_inputs import RelativeIdLayout


def dense_masks_and_ids(model: GlobalLocalModel, inputs: dict) -> tuple[Tensor, Tensor]:
    """allowed [B, N, N] bool and relative ids [B, N, N] over [long tokens | global tokens]."""
    config = model.config
    long_ids = inputs["long_input_ids"]
    batch, length = long_ids.shape
    global_ids = inputs.get("global_input_ids")
    num_globals = 0 if global_ids is None else global_ids.shape[1]
    long_mask = inputs.get("long_attention_mask", torch.ones(batch, length)).bool()
    global_mask = inputs.get("global_attention_mask", torch.ones(batch, num_globals)).bool()
    sentence_ids, mention_ids = inputs.get("sentence_ids"), inputs.get("mention_ids")
    # The example of every token of [long | global] (one per row when not given).
    examples = None
    if inputs.get("long_example_ids") is not None:
        examples = torch.cat([inputs["long_example_ids"], inputs["global_example_ids"]], dim=1)
    layout = RelativeIdLayout(config.max_relative_distance)  # the id numbering only; the rules are below
    k = layout.max_distance

    n = length + num_globals
    allowed = torch.zeros(batch, n, n, dtype=torch.bool)
    ids = torch.zeros(batch, n, n, dtype=torch.long)
    for example in range(batch):
        for query in range(n):
            for key in range(n):
                query_is_long, key_is_long = query < length, key < length
                if query_is_long and key_is_long:
                    ok = abs(key - query) <= config.local_radius and bool(long_mask[example, key])
                    if config.local_attention_within_paragraph and inputs.get("long_paragraph_ids") is not None:
                        paragraphs = inputs["long_paragraph_ids"][example]
                        ok = ok and bool(paragraphs[query] == paragraphs[key])
                    relative = key - query
                elif not query_is_long and not key_is_long:
                    g_query, g_key = query - length, key - length
                    ok = bool(global_mask[example, g_key])
                    relative = g_key - g_query
                    if inputs.get("global_paragraph_ids") is not None:
                        paragraphs = inputs["global_paragraph_ids"][example]
                        if paragraphs[g_query] != paragraphs[g_key]:
                            relative = None  # the "other paragraph" id
                else:
                    long_token, global_token = (query, key - length) if query_is_long else (key, query - length)
                    linked = sentence_ids is not None and (
                        int(sentence_ids[example, long_token]) == global_token
                        or (mention_ids is not None and int(mention_ids[example, long_token]) == global_token)
                    )
                    if query_is_long:
                        ok = bool(global_mask[example, global_token])
                        if config.hard_l2g and sentence_ids is not None:
                            ok = ok and linked
                    else:
                        ok = bool(long_mask[example, long_token])
                        sees_all = inputs.get("global_sees_all")
                        exempt = sees_all is not None and bool(sees_all[example, global_token])
                        if config.hard_g2l and sentence_ids is not None:
                            ok = ok and (linked or exempt)
                    relative = "linked" if linked else "unlinked"
                if examples is not None:  # packed rows: no attention across examples
                    ok = ok and bool(examples[example, query] == examples[example, key])
                allowed[example, query, key] = ok
                if relative == "linked":
                    ids[example, query, key] = layout.linked
                elif relative == "unlinked":
                    ids[example, query, key] = layout.unlinked
                elif relative is None:
                    ids[example, query, key] = layout.other_paragraph
                elif relative >= k:
                    ids[example, query, key] = layout.right_clipped
                elif relative <= -k:
                    ids[example, query, key] = layout.left_clipped
                else:
                    ids[example, query, key] = layout.right(relative) if relative >= 0 else layout.left(-relative)
    return allowed, ids


@dataclass
class DenseLayerAttention:
    """One layer of the dense computation, over [long tokens | global tokens] (N = L + G): `allowed` [B,
    N, N], the softmax's weights `probs` [B, h, N, N] (before talking heads' post mix), and the summed
    scores `summed` and the `carried` ones (None in the first layer, or without residual attention)."""

    allowed: Tensor
    probs: Tensor
    summed: Tensor
    carried: Tensor | None


def dense_forward(model: GlobalLocalModel, inputs: dict,
                  record: list[DenseLayerAttention] | None = None) -> tuple[Tensor, Tensor]:
    """(long_hidden_state [B, L, H], global_hidden_state [B, G, H]) by dense attention; each layer's
    attention appended to `record` when given."""
    config = model.config
    heads, size = config.num_attention_heads, config.head_size
    long_ids = inputs["long_input_ids"]
    batch, length = long_ids.shape
    global_ids = inputs.get("global_input_ids")
    num_globals = 0 if global_ids is None else global_ids.shape[1]
    allowed, relative_ids = dense_masks_and_ids(model, inputs)
    is_long_query = torch.arange(length + num_globals) < length  # [N]

    embeddings = model.embeddings
    long_hidden = embeddings(long_ids, inputs.get("long_token_type_ids"))
    if num_globals:
        global_hidden = embeddings(global_ids, inputs.get("global_token_type_ids"), inputs.get("global_features"),
                                   is_global=True)
    else:
        global_hidden = long_hidden.new_zeros(batch, 0, config.hidden_size)

    carried = None
    for number, layer in enumerate(model.encoder.layers, start=1):
        attention = layer.attention
        long_in, global_in = long_hidden, global_hidden
        if config.pre_layer_norm:
            long_in, global_in = layer.long_attention_norm(long_hidden), layer.global_attention_norm(global_hidden)
        qkv = torch.cat([attention.long_qkv(long_in), (attention.global_qkv or attention.long_qkv)(global_in)], dim=1)
        q, key, value = qkv.view(batch, -1, 3, heads, size).permute(2, 0, 3, 1, 4)  # [B, h, N, d]
        scores = q @ key.transpose(-1, -2)  # [B, h, N, N]
        values_of_long_queries = values_of_global_queries = value
        if config.cross_kv_projections:
            # Long queries read global tokens' keys and values through long_queries_global_kv,
            # global queries long tokens' through global_queries_long_kv: pair by pair.
            def key_values(projection, hidden):
                return projection(hidden).view(batch, -1, 2, heads, size).permute(2, 0, 3, 1, 4)

            global_key, global_value = key_values(attention.long_queries_global_kv, global_in)
            long_key, long_value = key_values(attention.global_queries_long_kv, long_in)
            scores[:, :, :length, length:] = q[:, :, :length] @ global_key.transpose(-1, -2)
            scores[:, :, length:, :length] = q[:, :, length:] @ long_key.transpose(-1, -2)
            values_of_long_queries = torch.cat([value[:, :, :length], global_value], dim=2)
            values_of_global_queries = torch.cat([long_value, value[:, :, length:]], dim=2)
        if config.uses_relative_positions:
            for softmax, rows in ((attention.long_softmax, is_long_query), (attention.global_softmax, ~is_long_query)):
                # q . E[id] + b[id], pair by pair (E [R, h, d], b [R, h])
                embedding = softmax.relative_key[relative_ids].permute(0, 3, 1, 2, 4)  # [B, h, N, N, d]
                term = (q.unsqueeze(3) * embedding).sum(-1) + softmax.relative_bias[relative_ids].permute(0, 3, 1, 2)
                scores = torch.where(rows.view(1, 1, -1, 1), scores + term, scores)
        scores = scores / math.sqrt(size)
        received = carried if config.residual_attention else None
        if received is not None:
            scores = scores + received
        carried = scores
        logits = scores / number if config.residual_attention_mean else scores
        if config.talking_heads:
            mixed = torch.empty_like(logits)
            for softmax, rows in ((attention.long_softmax, is_long_query), (attention.global_softmax, ~is_long_query)):
                mixed[:, :, rows] = torch.einsum("gh,bhqk->bgqk", softmax.talking_heads_pre, logits[:, :, rows])
            logits = mixed
        logits = logits.masked_fill(~allowed.unsqueeze(1), float("-inf"))
        probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # padding rows see nothing
        if record is not None:
            record.append(DenseLayerAttention(allowed, probs, scores, received))
        if config.talking_heads:
            mixed = torch.empty_like(probs)
            for softmax, rows in ((attention.long_softmax, is_long_query), (attention.global_softmax, ~is_long_query)):
                mixed[:, :, rows] = torch.einsum("gh,bhqk->bgqk", softmax.talking_heads_post, probs[:, :, rows])
            probs = mixed
        context = torch.cat([probs[:, :, :length] @ values_of_long_queries,
                             probs[:, :, length:] @ values_of_global_queries], dim=2)
        context = context.transpose(1, 2).reshape(batch, -1, config.hidden_size)
        long_attended = attention.long_output(context[:, :length])
        global_attended = (attention.global_output or attention.long_output)(context[:, length:])

        global_feed_forward = layer.global_feed_forward or layer.long_feed_forward
        if config.pre_layer_norm:
            long_hidden = long_hidden + long_attended
            global_hidden = global_hidden + global_attended
            long_hidden = long_hidden + layer.long_feed_forward(layer.long_output_norm(long_hidden))
            global_hidden = global_hidden + global_feed_forward(layer.global_output_norm(global_hidden))
        else:
            long_hidden = layer.long_attention_norm(long_hidden + long_attended)
            global_hidden = layer.global_attention_norm(global_hidden + global_attended)
            long_hidden = layer.long_output_norm(long_hidden + layer.long_feed_forward(long_hidden))
            global_hidden = layer.global_output_norm(global_hidden + global_feed_forward(global_hidden))
    if config.pre_layer_norm:
        long_hidden = model.encoder.final_long_norm(long_hidden)
        global_hidden = model.encoder.final_global_norm(global_hidden)
    return long_hidden, global_hidden
