"""Google's released RealFormer checkpoints (He et al., 2020; google-research realformer/) -> longdoc folders.

RealFormer is BERT with residual attention: each layer adds the previous layer's attention scores
to its own before the softmax (with `use_running_mean`, their running mean). Its checkpoints are
BERT's TF1 checkpoints (variables under `bert/`, BERT's MLM head under `cls/predictions/`) with a
`bert_config.json`. longdoc represents one exactly as a GlobalLocalModel without global tokens
whose local radius covers the whole input (dense attention), absolute positions, and residual
attention on: `realformer_config_to_longdoc`.

Dropped on purpose, each listed in the model card: BERT's pooler and next-sentence head (longdoc
pretrains with MLM and CPC, and no task reads the pooler), the optimizer's state and the step
counter. The MLM head goes to the pretraining heads file that `longdoc pretrain --init` reads; its
CPC projection, which RealFormer never had, starts as the identity (GlobalLocalForPretraining's
initialisation).

A plain BERT checkpoint has the same variables: converted here it would get residual attention it
was not trained with (`longdoc lift` is its converter). Nothing in the files tells them apart.
"""

import json
from pathlib import Path

import torch

from longdoc.convert.checkpoint import BERT_SHAPE_FIELDS
from longdoc.convert.etc import BERT_CONFIG_FILE, open_checkpoint
from longdoc.convert.tf_conversion import (
    ACTIVATIONS, OPTIMIZER_STATE, Dropped, Rule, conversion_summary, copy, dense_weight, fill, fused_bias, fused_weight,
    model_card,
)
from longdoc.errors import InputError
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.pretrained import GlobalLocalModel
from longdoc.model_folder import refuse_existing

# realformer.BertConfig's defaults, for fields a config file leaves out.
REALFORMER_DEFAULTS = dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
    hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=16,
    initializer_range=0.02, use_running_mean=False,
)
# transformers writes these into a bert_config.json it saves; they say nothing about the TF model.
IGNORED_CONFIG_FIELDS = {"model_type", "architectures", "transformers_version", "layer_norm_eps", "pad_token_id",
                         "position_embedding_type", "use_cache", "classifier_dropout", "directionality"}

BERT_HEADS = [
    Dropped(r"bert/pooler/dense/(kernel|bias)", "BERT's pooler: read only by the next-sentence head"),
    Dropped(r"cls/seq_relationship/output_(weights|bias)", "the next-sentence head: longdoc pretrains with MLM and CPC"),
]
MLM_SOURCES = {
    "mlm_transform.dense.weight": ("cls/predictions/transform/dense/kernel", dense_weight),
    "mlm_transform.dense.bias": ("cls/predictions/transform/dense/bias", copy),
    "mlm_transform.layer_norm.weight": ("cls/predictions/transform/LayerNorm/gamma", copy),
    "mlm_transform.layer_norm.bias": ("cls/predictions/transform/LayerNorm/beta", copy),
    "mlm_bias": ("cls/predictions/output_bias", copy),
}

REALFORMER_NOTES = """The encoder computes what RealFormer's `BertModel` computes on the same inputs: dense attention
(the local radius covers the whole input, no global tokens), BERT's absolute positions, residual
attention (running mean: `residual_attention_mean`). Give it `long_input_ids` (and token types and the
attention mask) only."""


def realformer_config_to_longdoc(source: dict, path: Path) -> GlobalLocalConfig:
    """A GlobalLocalConfig computing what realformer's BertModel computes with `source` (a bert_config.json)."""
    unknown = sorted(set(source) - set(REALFORMER_DEFAULTS) - IGNORED_CONFIG_FIELDS - {"vocab_size"})
    if unknown:
        raise InputError(f"{path}: unknown field(s) {', '.join(unknown)} (expected realformer BertConfig's fields)")
    if "vocab_size" not in source:
        raise InputError(f"{path}: no vocab_size (BertConfig needs it)")
    field = {**REALFORMER_DEFAULTS, **source}
    if field["hidden_act"] not in ACTIVATIONS:
        raise InputError(f"{path}: hidden_act = {json.dumps(field['hidden_act'])} cannot be converted: "
                         f"expected one of {', '.join(ACTIVATIONS)}")
    length = field["max_position_embeddings"]
    try:
        return GlobalLocalConfig(
            **{name: field[name] for name in BERT_SHAPE_FIELDS},
            hidden_act=ACTIVATIONS[field["hidden_act"]],
            hidden_dropout_prob=field["hidden_dropout_prob"],
            attention_probs_dropout_prob=field["attention_probs_dropout_prob"],
            type_vocab_size=field["type_vocab_size"],
            initializer_range=field["initializer_range"],
            layer_norm_eps=1e-12,  # tf_slim's layer_norm, as BERT's
            position_embedding_type="absolute",
            max_position_embeddings=length,
            long_max_len=length,
            global_max_len=0,
            local_radius=length,  # every token sees every other: BERT's dense attention
            residual_attention=True,
            residual_attention_mean=field["use_running_mean"],
            hard_g2l=False,
            share_qkv=True,
            share_attention_output=True,
            share_feed_forward=True,
        )
    except ValueError as error:
        raise InputError(f"{path}: {error}") from None


def _pair(target: str, source: str, norm: bool = False) -> list[Rule]:
    if norm:
        return [Rule(f"{target}.weight", (f"{source}/gamma",), copy), Rule(f"{target}.bias", (f"{source}/beta",), copy)]
    return [Rule(f"{target}.weight", (f"{source}/kernel",), dense_weight), Rule(f"{target}.bias", (f"{source}/bias",), copy)]


def realformer_rules(config: GlobalLocalConfig) -> list[Rule]:
    """Rules from BERT's variable names to GlobalLocalModel's parameters. The global stream's
    norms (unused without global tokens) get the long stream's, as `longdoc lift` gives them."""
    embeddings = "bert/embeddings"
    rules = [
        Rule("embeddings.word_embeddings.weight", (f"{embeddings}/word_embeddings",), copy),
        Rule("embeddings.token_type_embeddings.weight", (f"{embeddings}/token_type_embeddings",), copy),
        Rule("embeddings.position_embeddings.weight", (f"{embeddings}/position_embeddings",), copy),
        *_pair("embeddings.layer_norm", f"{embeddings}/LayerNorm", norm=True),
    ]
    for i in range(config.num_hidden_layers):
        layer, target = f"bert/encoder/layer_{i}", f"encoder.layers.{i}"
        projections = [f"{layer}/attention/self/{name}" for name in ("query", "key", "value")]
        rules += [Rule(f"{target}.attention.long_qkv.weight", tuple(f"{p}/kernel" for p in projections), fused_weight),
                  Rule(f"{target}.attention.long_qkv.bias", tuple(f"{p}/bias" for p in projections), fused_bias)]
        rules += _pair(f"{target}.attention.long_output", f"{layer}/attention/output/dense")
        rules += _pair(f"{target}.long_feed_forward.intermediate", f"{layer}/intermediate/dense")
        rules += _pair(f"{target}.long_feed_forward.output", f"{layer}/output/dense")
        for stream in ("long", "global"):
            rules += _pair(f"{target}.{stream}_attention_norm", f"{layer}/attention/output/LayerNorm", norm=True)
            rules += _pair(f"{target}.{stream}_output_norm", f"{layer}/output/LayerNorm", norm=True)
    return rules


def mlm_head_shapes(config: GlobalLocalConfig) -> dict[str, torch.Size]:
    hidden = config.hidden_size
    return {"mlm_transform.dense.weight": torch.Size([hidden, hidden]), "mlm_transform.dense.bias": torch.Size([hidden]),
            "mlm_transform.layer_norm.weight": torch.Size([hidden]), "mlm_transform.layer_norm.bias": torch.Size([hidden]),
            "mlm_bias": torch.Size([config.vocab_size])}


def convert_realformer(folder: str | Path, out: str | Path, vocab: str | Path | None = None,
                       lower_case: bool = True, progress: bool = False) -> dict:
    """Convert the RealFormer checkpoint folder `folder` into the longdoc model folder `out`
    (written atomically); returns the conversion summary."""
    from longdoc.convert.tf_conversion import save_converted
    from longdoc.convert.vocabulary import read_vocabulary
    from longdoc.model.pretraining import HEADS_FILE

    out = Path(out)
    refuse_existing(out)
    checkpoint, config_path, source_config = open_checkpoint(folder, "bert")
    folder = checkpoint.prefix.parent  # the vocabulary lies beside the checkpoint too
    config = realformer_config_to_longdoc(source_config, config_path)
    model = GlobalLocalModel(config)
    rules = realformer_rules(config)
    expected = {name: value.shape for name, value in model.state_dict().items()}
    present = [name for name, (source, _) in MLM_SOURCES.items() if source in checkpoint.entries]
    if present:
        # A pretraining checkpoint: its MLM head too (all of it, or check_coverage names what is missing).
        rules += [Rule(target, (source,), combine) for target, (source, combine) in MLM_SOURCES.items()]
        expected.update(mlm_head_shapes(config))
    conversion = fill(checkpoint, rules, [*BERT_HEADS, *OPTIMIZER_STATE], expected, "RealFormer", progress=progress)
    heads = {name: conversion.state.pop(name) for name in MLM_SOURCES if name in conversion.state}
    model.load_state_dict(conversion.state, strict=True)
    if heads:
        hidden = config.hidden_size
        heads["cpc_projection.weight"] = torch.eye(hidden)
        heads["cpc_projection.bias"] = torch.zeros(hidden)
    tokenizer, vocabulary = read_vocabulary(folder, None if vocab is None else Path(vocab), lower_case,
                                            config.long_max_len, config.vocab_size)
    summary = conversion_summary("realformer", folder, out, checkpoint, conversion, vocabulary, sorted(heads))
    card = model_card(out.name, summary, source_config, BERT_CONFIG_FILE, REALFORMER_NOTES + (
        "\n\nThe CPC projection in the pretraining heads is the identity (RealFormer has no CPC head)." if heads else ""))
    save_converted(out, model, tokenizer, card, heads, HEADS_FILE)
    return summary
