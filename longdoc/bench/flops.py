"""Analytic matmul FLOPs of one forward pass of GlobalLocalModel, counted as the encoder computes them.

Two FLOPs per multiply-add; only matrix products count (softmax, norms, gathers and the residual
score sums are memory-bound and left out). The encoder pads the long input to whole blocks of
b = r + 1 tokens (b = L when the input is shorter than one block) before the first layer,
Lp = ceil(L / b) * b, so every per-token matmul runs on N = Lp + G positions. Per layer, with H hidden, h heads, F the feed-forward size:
- projections: query/key/value 2 N H 3H, attention output 2 N H H, feed-forward 2 N H F twice;
- long softmax (ETC l2l + l2g, blocked): each of the Lp padded queries scores the 3b keys of its own
  and neighbouring blocks plus the G globals, 2 Lp (3b + G) H, and the same again for the values;
- global softmax (g2g + g2l): G queries over G + Lp keys, 2 G (G + Lp) H for scores and for values;
  where the compiled kernel skips the long keys hard g2l hides from a sentence's global token, G
  queries over G + K keys, K the long tokens each owns (`long_keys_per_global`): only the pairs the
  mask allows count, not the neighbours' keys a chunk of queries also scores;
- relative positions (ETC): every query is multiplied with the relative key table, 2 (Lp + G) R H;
- talking heads (Shazeer et al., 2020): an h x h head mix before and after the softmax for every
  (query, key) pair, 2 h^2 per pair each.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class FlopCount:
    """Matmul FLOPs of one forward pass, by part (each summed over all layers)."""

    parts: dict

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def encoder_forward_flops(
    config, long_length: int, global_length: int, long_keys_per_global: int | None = None
) -> FlopCount:
    """FLOPs of GlobalLocalModel(config) on one example of `long_length` long and `global_length` global
    tokens; `long_keys_per_global`: the long keys each global query's softmax covers (None: all)."""
    hidden, heads, layers = config.hidden_size, config.num_attention_heads, config.num_hidden_layers
    block = min(config.block_size, long_length)
    padded = -(-long_length // block) * block
    tokens = padded + global_length
    long_pairs = padded * (3 * block + global_length)
    global_pairs = global_length * (global_length + (padded if long_keys_per_global is None else long_keys_per_global))

    per_layer = {
        "qkv projections": 2 * tokens * hidden * 3 * hidden,
        "attention output": 2 * tokens * hidden * hidden,
        "feed-forward": 2 * 2 * tokens * hidden * config.intermediate_size,
        "long scores": 2 * long_pairs * hidden,
        "long values": 2 * long_pairs * hidden,
        "global scores": 2 * global_pairs * hidden,
        "global values": 2 * global_pairs * hidden,
    }
    if config.uses_relative_positions:
        per_layer["relative positions"] = 2 * (padded + global_length) * config.relative_vocab_size * hidden
    if config.talking_heads:
        per_layer["talking heads"] = 2 * 2 * heads * heads * (long_pairs + global_pairs)
    return FlopCount({part: layers * flops for part, flops in per_layer.items()})
