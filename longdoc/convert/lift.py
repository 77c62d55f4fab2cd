"""Weight lifting: a BERT-family checkpoint (BERT, RoBERTa, MiniLM) -> a `GlobalLocalModel` checkpoint.

ETC (Ainslie et al., 2020, arXiv:2004.08483, section 3.5) lifts BERT into the global-local model:
embedding, Q/K/V, attention output, feed-forward and LayerNorm weights are copied into both the long
and the global stream (once, where the config shares a stream's weights), and the relative
position tables start fresh. Position options:
- "relative" (ETC): absolute positions are dropped; the relative key/bias tables are left as
  `GlobalLocalModel` initialises them.
- "absolute" (Longformer, Beltagy et al., 2020, arXiv:2004.05150, section 5): the position table is
  kept and tiled to the long length (row i of the new table is source row i mod 512); no relative terms.
- "both": the tiled table and fresh relative tables.
With "absolute", no global tokens and a radius at least the input length, the lifted model computes
exactly what the source BERT computes (tests/convert/test_lift.py checks it against transformers' BertModel).

A transformers extractive QA checkpoint (BertForQuestionAnswering, RobertaForQuestionAnswering, ...:
checkpoint.READER_ARCHITECTURES) is lifted into a `SpanReader`: the encoder as above, its `qa_outputs`
as the span head. A reader is meant to answer as lifted, without training, so its options default to
READER_DEFAULTS, the computation of its source: absolute positions, no residual attention. Then, on
inputs the local window covers, its start/end logits are the source's (tests/convert/test_lift_qa.py).

Lifting is deterministic: the fresh parameters are drawn under `LiftOptions.seed`. The output folder
(weights as safetensors, config, tokenizer, README.md model card) appears atomically: it is built in
a temporary folder beside the target and renamed into place.
"""

import copy
import os
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from longdoc.convert.checkpoint import (
    BERT_SHAPE_FIELDS, READER_HEAD, BertCheckpoint, locate_checkpoint, read_checkpoint,
)
from longdoc.errors import InputError, OptionError
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.pretrained import GlobalLocalModel
from longdoc.model.span_reader import SpanReader
from longdoc.model_folder import read_tokenizer, refuse_existing, save_model, write_new_folder

# Bump when the meaning of a lifted checkpoint changes, so caches of lifted models are rebuilt.
LIFT_FORMAT_VERSION = 2  # 2: global tokens take no absolute positions

POSITION_CHOICES = ("relative", "absolute", "both")

# Per-layer target name, with the stream ("long_" / "global_") removed -> BERT name under "encoder.layer.{i}.".
# The fused Q/K/V projection is handled apart: it concatenates three BERT projections.
_LAYER_SOURCES = {
    "attention.output": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "feed_forward.intermediate": "intermediate.dense",
    "feed_forward.output": "output.dense",
    "output_norm": "output.LayerNorm",
}
_EMBEDDING_SOURCES = {
    "embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight",
    "embeddings.token_type_embeddings.weight": "embeddings.token_type_embeddings.weight",
    "embeddings.layer_norm.weight": "embeddings.LayerNorm.weight",
    "embeddings.layer_norm.bias": "embeddings.LayerNorm.bias",
}
# Parameters BERT has no counterpart for: they keep the values GlobalLocalModel initialised (each
# softmax's own parameters, SoftmaxParameters, are all of that kind).
_FRESH = re.compile(
    r"encoder\.layers\.\d+\.attention\.(long|global)_softmax\.\w+"
    r"|embeddings\.global_feature_projection\.(weight|bias)"
)
_LAYER_PARAMETER = re.compile(r"encoder\.layers\.(\d+)\.(.+)\.(weight|bias)")


@dataclass(frozen=True)
class LiftOptions:
    """What to build around the source weights. Defaults follow ETC-base."""

    positions: str = "relative"
    residual_attention: bool = True
    talking_heads: bool = False
    local_radius: int = 84
    long_max_len: int = 4096
    global_max_len: int = 256
    share_qkv: bool = False
    share_attention_output: bool = False
    share_feed_forward: bool = False
    seed: int = 0


# The options a QA reader is lifted with unless others are chosen: its source's computation. Fresh
# relative tables or residual scores would change every logit of a reader that is used untrained,
# and a window of 384 covers the rows Hub readers were trained on (longdoc.ask.span_reading).
READER_DEFAULTS = {"positions": "absolute", "residual_attention": False, "local_radius": 383}


def default_options(checkpoint: BertCheckpoint, **chosen) -> LiftOptions:
    """The options `chosen`, the others at their defaults for `checkpoint`: READER_DEFAULTS over
    LiftOptions' for a QA reader, LiftOptions' (ETC-base) for an encoder."""
    defaults = READER_DEFAULTS if checkpoint.span_head is not None else {}
    return LiftOptions(**{**defaults, **chosen})


@dataclass
class LiftResult:
    """A lifted model and where each of its parameters came from."""

    model: GlobalLocalModel
    copied: list[str] = field(default_factory=list)        # filled from the source
    initialised: list[str] = field(default_factory=list)   # left as GlobalLocalModel initialised them


def lifted_config(checkpoint: BertCheckpoint, options: LiftOptions) -> GlobalLocalConfig:
    """The GlobalLocalConfig with the source's shapes and the lift options."""
    if options.positions not in POSITION_CHOICES:
        raise OptionError("{positions} must be one of {choices}, got {got!r}", choices=", ".join(POSITION_CHOICES),
                          got=options.positions)
    source = checkpoint.config
    try:
        return GlobalLocalConfig(
            **{name: source[name] for name in BERT_SHAPE_FIELDS},
            hidden_act=source["hidden_act"],
            hidden_dropout_prob=source.get("hidden_dropout_prob", 0.1),
            attention_probs_dropout_prob=source.get("attention_probs_dropout_prob", 0.1),
            layer_norm_eps=source["layer_norm_eps"],
            initializer_range=source.get("initializer_range", 0.02),
            type_vocab_size=source["type_vocab_size"],
            pad_token_id=source["pad_token_id"],
            long_max_len=options.long_max_len,
            global_max_len=options.global_max_len,
            local_radius=options.local_radius,
            position_embedding_type=options.positions,
            global_absolute_positions=False,  # global tokens are structure, not text at position g
            # The tiled table covers every long and global position (global token g reads row g).
            max_position_embeddings=max(options.long_max_len, options.global_max_len),
            residual_attention=options.residual_attention,
            talking_heads=options.talking_heads,
            share_qkv=options.share_qkv,
            share_attention_output=options.share_attention_output,
            share_feed_forward=options.share_feed_forward,
        )
    except ValueError as error:
        raise InputError(f"cannot lift {checkpoint.directory} with these options: {error}") from None


def tile_positions(checkpoint: BertCheckpoint, length: int) -> torch.Tensor:
    """[length, H] position table: row i is the source's row for position i mod its usable length.

    Longformer's copy initialisation: attention patterns learnt for 512 positions repeat every 512
    tokens. RoBERTa's rows start at pad_token_id + 1, so those rows are the ones tiled.
    """
    table = checkpoint.weights["embeddings.position_embeddings.weight"]
    usable = table[checkpoint.position_offset: checkpoint.position_offset + checkpoint.usable_positions]
    repeats = -(-length // usable.shape[0])
    return usable.repeat(repeats, 1)[:length]


def source_tensor(checkpoint: BertCheckpoint, target_name: str, target_shape: torch.Size) -> torch.Tensor | None:
    """The source values for one target parameter, or None for a parameter BERT has no counterpart for."""
    weights = checkpoint.weights
    if target_name in _EMBEDDING_SOURCES:
        return weights[_EMBEDDING_SOURCES[target_name]]
    if target_name == "embeddings.position_embeddings.weight":
        return tile_positions(checkpoint, target_shape[0])
    if _FRESH.fullmatch(target_name):
        return None
    match = _LAYER_PARAMETER.fullmatch(target_name)
    if match:
        layer, module, parameter = match.groups()
        # Both streams start from the same BERT weights: drop the stream from the name.
        module = re.sub(r"(^|\.)(long|global)_", r"\1", module)
        prefix = f"encoder.layer.{layer}."
        if module == "attention.qkv":
            # One fused projection, rows ordered query, key, value.
            return torch.cat([weights[f"{prefix}attention.self.{part}.{parameter}"] for part in ("query", "key", "value")])
        if module in _LAYER_SOURCES:
            return weights[f"{prefix}{_LAYER_SOURCES[module]}.{parameter}"]
    # A parameter this module does not know: fail loudly rather than leave it silently random.
    raise RuntimeError(f"weight lifting has no rule for GlobalLocalModel parameter {target_name}; extend longdoc/convert/lift.py")


def lift_model(checkpoint: BertCheckpoint, options: LiftOptions) -> LiftResult:
    """Build a GlobalLocalModel from `checkpoint`'s weights (in memory; see `lift` to save one)."""
    config = lifted_config(checkpoint, options)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(options.seed)
        model = GlobalLocalModel(config)
    result = LiftResult(model)
    buffers = {name for name, _ in model.named_buffers()}
    state = model.state_dict()
    for name, current in state.items():
        if name in buffers:
            continue
        values = source_tensor(checkpoint, name, current.shape)
        if values is None:
            result.initialised.append(name)
            continue
        if values.shape != current.shape:
            raise InputError(
                f"{checkpoint.directory}: weight for {name} has shape {tuple(values.shape)}, but the config "
                f"asks for {tuple(current.shape)} (config.json and the weights disagree)"
            )
        state[name] = values.to(current.dtype)
        result.copied.append(name)
    model.load_state_dict(state, strict=True)
    return result


def lift_reader(checkpoint: BertCheckpoint, options: LiftOptions) -> tuple[SpanReader, LiftResult]:
    """A SpanReader from a QA checkpoint: the lifted encoder and the checkpoint's `qa_outputs` as its span head."""
    result = lift_model(checkpoint, options)
    # Every parameter drawn here is overwritten below; the fork keeps the caller's random state as it was.
    with torch.random.fork_rng(devices=[]):
        reader = SpanReader(copy.deepcopy(result.model.config))
    reader.config.architectures = [SpanReader.__name__]
    reader.encoder.load_state_dict(result.model.state_dict())
    reader.span_head.projection.load_state_dict(checkpoint.span_head)
    return reader, result


def lift(source: str, out: str | os.PathLike, options: LiftOptions | dict = LiftOptions()) -> Path:
    """Lift `source` (a directory or a hub id) and save model, tokenizer and model card to `out`.

    `options`: all of them (a LiftOptions), or a dict of those chosen, the others at the defaults for
    what `source` is (`default_options`). A QA checkpoint gives a SpanReader, any other an encoder."""
    out = Path(out)
    refuse_existing(out)
    directory = locate_checkpoint(source)
    checkpoint = read_checkpoint(directory)
    if not isinstance(options, LiftOptions):
        options = default_options(checkpoint, **options)
    tokenizer = read_tokenizer(directory)
    if len(tokenizer) > checkpoint.config["vocab_size"]:
        raise InputError(
            f"{directory}: the tokenizer has {len(tokenizer)} tokens but the embeddings only "
            f"{checkpoint.config['vocab_size']} rows"
        )
    # The tokenizer's own limit (512 for BERT) would make it warn on every long document.
    tokenizer.model_max_length = options.long_max_len
    if checkpoint.span_head is not None:
        model, result = lift_reader(checkpoint, options)
    else:
        result = lift_model(checkpoint, options)
        model = result.model

    def write(folder: Path) -> None:
        save_model(folder, model, tokenizer, card=model_card(source, checkpoint, options, result, out.name))

    return write_new_folder(out, write)


def model_card(source: str, checkpoint: BertCheckpoint, options: LiftOptions, result: LiftResult, title: str) -> str:
    """README.md for a lifted checkpoint: where it came from, how it was lifted, what is fresh."""
    config = checkpoint.config
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    option_rows = "\n".join(f"| `{key}` | `{value}` |" for key, value in asdict(options).items())
    weight_rows = "\n".join(f"- `{file}` sha256 `{digest}`" for file, digest in checkpoint.weight_files.items())
    fresh = sorted({re.sub(r"layers\.\d+\.", "layers.*.", name) for name in result.initialised})
    fresh_text = "\n".join(f"- `{name}`" for name in fresh) or "- none"
    unused_text = ", ".join(f"`{name}`" for name in checkpoint.unused) or "none"
    positions = {
        "relative": "absolute positions dropped, relative key/bias tables freshly initialised (ETC)",
        "absolute": f"source position table tiled to {max(options.long_max_len, options.global_max_len)} rows "
                    f"(row i = source row {checkpoint.position_offset} + i mod {checkpoint.usable_positions}); "
                    "no relative terms (Longformer)",
        "both": "tiled source position table and freshly initialised relative tables",
    }[options.positions]
    if checkpoint.span_head is None:
        kind = "global-local (ETC-style) encoder"
        use = f"""from longdoc import GlobalLocalModel

model = GlobalLocalModel.from_pretrained("{title}")"""
    else:
        kind = "span reader (global-local encoder + start/end span head)"
        use = f"""from longdoc.model.span_reader import SpanReader

reader = SpanReader.from_pretrained("{title}")  # reader(**inputs).start_logits, .end_logits"""
    return f"""# {title}

A longdoc {kind} lifted from a {config['model_type']} checkpoint by `longdoc lift`.

- Source checkpoint: `{source}` ({config['num_hidden_layers']} layers, hidden size {config['hidden_size']}, \
{config['num_attention_heads']} heads, vocabulary {config['vocab_size']}).
- Source folder: `{checkpoint.directory}`.
- Source architecture: `{", ".join(config.get("architectures") or []) or "not recorded in config.json"}`.
- Source `_name_or_path`: `{config.get("_name_or_path") or "not recorded in config.json"}`.
- Date: {date}.
- Lift format version: {LIFT_FORMAT_VERSION}.
{reader_section(checkpoint, options)}
Source weights:
{weight_rows}

## Options

| option | value |
| --- | --- |
{option_rows}

Positions: {positions}.
Embedding, Q/K/V, attention output, feed-forward and LayerNorm weights are copied from the source into
both the long and the global stream ({len(result.copied)} tensors filled).

Left as initialised (seed {options.seed}):
{fresh_text}

Source tensors not used: {unused_text}.

## Use

```python
from transformers import AutoTokenizer
{use}
tokenizer = AutoTokenizer.from_pretrained("{title}")
```
"""


def reader_section(checkpoint: BertCheckpoint, options: LiftOptions) -> str:
    """The model card's account of a QA reader's span head and input layout ("" for an encoder)."""
    if checkpoint.span_head is None:
        return ""
    # Talking heads start at identity, so they leave the computation as it is.
    if options.positions == "absolute" and not options.residual_attention:
        covered = min(options.local_radius + 1, checkpoint.usable_positions)
        agreement = (f"With these options, on inputs of at most {covered} tokens (the local window and the source's "
                     "positions cover them) and no global tokens, its start/end logits are the source's.")
    else:
        agreement = ("These options change the source's computation (fresh relative tables, or residual attention): "
                     "train it before reading with it.")
    return f"""
## Span reader

The source's `{READER_HEAD}` (Linear {checkpoint.config['hidden_size']} -> 2: start, end logits) is
`span_head.projection`, unchanged. Put the question and the context in the long input as the source's
tokenizer pairs them (`tokenizer(question, context)`: its special tokens and token types).
{agreement}
"""
