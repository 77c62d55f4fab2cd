"""Google's released ETC checkpoints (etcmodel, Ainslie et al., 2020) -> longdoc model folders.

A released ETC folder holds `model.ckpt-N.index` / `.data-*` (a TF1 checkpoint of etcmodel's
`EtcModel`, variables under `etc_document_bert/`), `etc_config.json` (etcmodel's `EtcConfig`) and
the vocabulary. `convert_etc` writes a longdoc folder: `model.safetensors` + `config.json` (a
`GlobalLocalModel`), the tokenizer, and a model card naming the source.

Every field of etc_config.json is mapped to a GlobalLocalConfig field or refused with its value
(`etc_config_to_longdoc`); a field the file leaves out takes EtcConfig's default, not longdoc's.
Every checkpoint variable is read by a rule or dropped for a stated reason
(longdoc.convert.tf_conversion); the optimizer's slots and the step counter are the only drops.

Without `share_qkv_projections`, etcmodel projects keys and values per attention piece (l2l, l2g,
g2g, g2l); the converted model has `cross_kv_projections`, whose l2g and g2l projections hold them.
With `share_kv_projections` etcmodel's l2g keys are made by the l2l projection and its g2l keys by
the g2g one: those variables fill both of longdoc's parameters.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from longdoc.convert.tf_checkpoint import TFCheckpoint, find_checkpoint
from longdoc.convert.tf_conversion import (
    ACTIVATIONS, OPTIMIZER_STATE, Conversion, Dropped, Rule, UnreadVariables, conversion_summary, copy, dense_weight,
    fill, fused_bias,
    fused_weight, model_card,
)
from longdoc.errors import InputError, OptionError
from longdoc.io import read_json
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.pretrained import GlobalLocalModel
from longdoc.model.side_inputs import RelativeIdLayout
from longdoc.model_folder import refuse_existing

ETC_CONFIG_FILE = "etc_config.json"
BERT_CONFIG_FILE = "bert_config.json"
ETC_SCOPE = "etc_document_bert/"

# etcmodel's EtcConfig defaults (etcmodel/models/modeling.py), for fields a config file leaves out.
ETC_DEFAULTS = dict(
    segment_vocab_size=16, embedding_size=None, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
    local_radius=84, att_size_per_head=None, relative_pos_max_distance=12, relative_vocab_size=32,
    max_absolute_position_embeddings=0, intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1, initializer_range=0.02, share_feed_forward_params=True,
    share_kv_projections=False, share_qkv_projections=True, share_att_output_projection=False,
    use_pre_activation_order=False, use_hard_g2l_mask=False, use_hard_l2g_mask=False, grad_checkpointing_period=0,
)

# The input conventions etcmodel's input code gave the released checkpoints, written into the
# converted config.json so that longdoc's feature builders follow them (GlobalLocalConfig's input
# conventions). Token types: EtcModel.call's defaults, 1 for long and 0 for global tokens, which
# the released fine-tuning code keeps "for transfer learning" (hotpotqa/generate_tf_examples_lib.py:
# GLOBAL_TOKEN_TYPE_ID = 0, SENTENCE_TOKEN_TYPE_ID = 1). Global token ids, by vocabulary (the same
# file's WORDPIECE_DEFAULT_GLOBAL_TOKEN_IDS and SENTENCEPIECE_DEFAULT_GLOBAL_TOKEN_IDS):
# - BERT's WordPiece (the base checkpoints): sentence [unused0] = 1 and the CPC-masked sentence
#   [unused1] = 2 ("used in pretraining"), question [unused2] = 3 (one global per question
#   wordpiece, as in etcmodel's HotpotQA and WikiHop inputs), candidate [unused3] = 4, paragraph
#   [unused4] = 5; etcmodel names no DOM-node id, longdoc's takes the next, [unused5] = 6.
# - the large checkpoints' SentencePiece model: sentence "</s>" = 1, CPC-masked sentence "<s>" = 2,
#   question "<unused_40>" = 41, candidate "<unused_41>" = 42, paragraph "<unused_42>" = 43; DOM
#   node the next, "<unused_43>" = 44.
ETC_TOKEN_TYPES = dict(long_question_token_type_id=1, long_document_token_type_id=1,
                       global_question_token_type_id=0, global_structure_token_type_id=0)
ETC_INPUT_CONVENTIONS = dict(
    **ETC_TOKEN_TYPES, global_token_ids=dict(sentence=1, cpc_mask=2, question=3, candidate=4, paragraph=5, dom_node=6),
)
ETC_SENTENCEPIECE_INPUT_CONVENTIONS = dict(
    **ETC_TOKEN_TYPES,
    global_token_ids=dict(sentence=1, cpc_mask=2, question=41, candidate=42, paragraph=43, dom_node=44),
)
# The SentencePiece tokenizer's special tokens. CLS (the first long and global token): "<unused_39>"
# = 40, SENTENCEPIECE_DEFAULT_GLOBAL_TOKEN_IDS's CLS_TOKEN_ID; longdoc's feature builders take the
# tokenizer's cls id. SEP and padding: etcmodel's NQ input code for SentencePiece vocabularies
# (nq/preproc_nq_lib.py, tokenizer_type "ALBERT": sep "<unused_2>", pad "<pad>"); its HotpotQA and
# WikiHop inputs have no SEP.
ETC_SENTENCEPIECE_TOKENS = dict(cls_token="<unused_39>", sep_token="<unused_2>", pad_token="<pad>")
# The ids etcmodel's code names with their pieces' names (SENTENCEPIECE_DEFAULT_GLOBAL_TOKEN_IDS):
# a SentencePiece model without them is not the one the checkpoint was trained with.
ETC_SENTENCEPIECE_IDS = {1: "</s>", 2: "<s>", 40: "<unused_39>", 41: "<unused_40>", 42: "<unused_41>",
                         43: "<unused_42>"}


def input_conventions(sentencepiece: bool) -> dict:
    return ETC_SENTENCEPIECE_INPUT_CONVENTIONS if sentencepiece else ETC_INPUT_CONVENTIONS


@dataclass(frozen=True)
class LengthOptions:
    """The input lengths the converted model accepts; the checkpoint does not fix them (relative
    positions). Defaults: ETC's pretraining lengths."""

    long_max_len: int = 4096
    global_max_len: int = 256


def _field(source: dict, name: str):
    return source[name] if name in source else ETC_DEFAULTS[name]


def _refuse(path: Path, name: str, value, expected: str) -> InputError:
    return InputError(f"{path}: {name} = {json.dumps(value)} cannot be converted: {expected}")


def etc_config_to_longdoc(source: dict, path: Path, lengths: LengthOptions,
                          conventions: dict = ETC_INPUT_CONVENTIONS) -> GlobalLocalConfig:
    """A GlobalLocalConfig computing what etcmodel computes with `source` (an etc_config.json), with
    etcmodel's input `conventions` for the checkpoint's vocabulary (`input_conventions`)."""
    unknown = sorted(set(source) - set(ETC_DEFAULTS) - {"vocab_size"})
    if unknown:
        raise InputError(f"{path}: unknown field(s) {', '.join(unknown)} (expected only etcmodel EtcConfig's fields)")
    if "vocab_size" not in source:
        raise InputError(f"{path}: no vocab_size (EtcConfig needs it)")
    hidden, heads = _field(source, "hidden_size"), _field(source, "num_attention_heads")
    for name, allowed in (("embedding_size", (None, hidden)), ("att_size_per_head", (None, hidden // heads)),
                          ("max_absolute_position_embeddings", (0,)), ("use_pre_activation_order", (False,))):
        value = _field(source, name)
        if value not in allowed:
            expected = {
                "embedding_size": f"longdoc's embeddings have the hidden size ({hidden}); expected null or {hidden}",
                "att_size_per_head": f"longdoc's heads have hidden_size / num_attention_heads = {hidden // heads} "
                                     "dimensions; expected null or that",
                "max_absolute_position_embeddings": "etcmodel's absolute positions have separate long and global "
                                                    "tables, longdoc one; expected 0 (relative positions only)",
                "use_pre_activation_order": "etcmodel's pre-LN stack has no final LayerNorm, longdoc's pre-LN adds "
                                            "one per stream; expected false",
            }[name]
            raise _refuse(path, name, value, expected)
    activation = _field(source, "hidden_act")
    if activation not in ACTIVATIONS:
        raise _refuse(path, "hidden_act", activation, f"expected one of {', '.join(ACTIVATIONS)}")
    relative_vocab_size = _field(source, "relative_vocab_size")
    if relative_vocab_size is None:
        raise _refuse(path, "relative_vocab_size", None, "longdoc's ETC encoder always uses relative positions; "
                      "expected a vocabulary of at least 2 * relative_pos_max_distance + 4")
    try:
        return GlobalLocalConfig(
            vocab_size=source["vocab_size"],
            type_vocab_size=_field(source, "segment_vocab_size"),
            hidden_size=hidden,
            num_hidden_layers=_field(source, "num_hidden_layers"),
            num_attention_heads=heads,
            intermediate_size=_field(source, "intermediate_size"),
            hidden_act=ACTIVATIONS[activation],
            hidden_dropout_prob=_field(source, "hidden_dropout_prob"),
            attention_probs_dropout_prob=_field(source, "attention_probs_dropout_prob"),
            initializer_range=_field(source, "initializer_range"),
            layer_norm_eps=1e-12,  # etcmodel's LayerNormalization epsilon everywhere
            long_max_len=lengths.long_max_len,
            global_max_len=lengths.global_max_len,
            local_radius=_field(source, "local_radius"),
            position_embedding_type="relative",
            max_relative_distance=_field(source, "relative_pos_max_distance"),
            relative_vocab_size=relative_vocab_size,
            hard_g2l=_field(source, "use_hard_g2l_mask"),
            hard_l2g=_field(source, "use_hard_l2g_mask"),
            residual_attention=False,
            talking_heads=False,
            pre_layer_norm=False,
            separate_global_embedding_norm=True,
            share_qkv=_field(source, "share_qkv_projections"),
            cross_kv_projections=not _field(source, "share_qkv_projections"),
            share_attention_output=_field(source, "share_att_output_projection"),
            share_feed_forward=_field(source, "share_feed_forward_params"),
            **conventions,
            # share_kv_projections has no field of its own here: it decides which variables fill the
            # cross projections (etc_rules); grad_checkpointing_period only trades memory for time in training.
        )
    except ValueError as error:
        raise InputError(f"{path}: {error}") from None


def _norm(target: str, source: str) -> list[Rule]:
    return [Rule(f"{target}.weight", (f"{source}/gamma",), copy), Rule(f"{target}.bias", (f"{source}/beta",), copy)]


def _dense(target: str, source: str) -> list[Rule]:
    return [Rule(f"{target}.weight", (f"{source}/kernel",), dense_weight),
            Rule(f"{target}.bias", (f"{source}/bias",), copy)]


def _fused(target: str, attention: str, *pieces: str) -> list[Rule]:
    """One longdoc projection from etcmodel's `pieces` (query, key, value or key, value), in order."""
    projections = [f"{attention}/{name}_projection/linear" for name in pieces]
    return [Rule(f"{target}.weight", tuple(f"{p}/kernel" for p in projections), fused_weight),
            Rule(f"{target}.bias", tuple(f"{p}/bias" for p in projections), fused_bias)]


def _feed_forward(target: str, source: str) -> list[Rule]:
    return _dense(f"{target}.intermediate", f"{source}/dense_layers/layer_0") + _dense(f"{target}.output", f"{source}/dense_layers/layer_1")


def _relative_rows(layout: RelativeIdLayout):
    """etcmodel's relative table [R, ...] -> longdoc's: the same ids but the two long-global ones.
    etcmodel's input code (input_utils.make_global_local_transformer_side_inputs) gives a pair
    2k+1 + (1 if the long token belongs to the global one else 0): unlinked 2k+1, linked 2k+2;
    longdoc's RelativeIdLayout has linked 2k+1, unlinked 2k+2. Swapping the two rows makes every
    pair read the row etcmodel read for it."""
    etc_unlinked, etc_linked = 2 * layout.max_distance + 1, 2 * layout.max_distance + 2

    def combine(values: list[np.ndarray]) -> np.ndarray:
        (table,) = values
        rows = np.arange(len(table))
        rows[[layout.linked, layout.unlinked]] = [etc_linked, etc_unlinked]
        return table[rows]

    return combine


def etc_rules(config: GlobalLocalConfig, share_kv_projections: bool) -> list[Rule]:
    """Rules from etcmodel's variable names (EtcModel, GlobalLocalTransformerLayers,
    FusedGlobalLocalAttention) to GlobalLocalModel's parameters."""
    scope, layers = ETC_SCOPE, f"{ETC_SCOPE}global_local_transformer_layers"
    rules = [
        Rule("embeddings.word_embeddings.weight", (f"{scope}token_emb_lookup/embedding_table",), copy),
        Rule("embeddings.token_type_embeddings.weight", (f"{scope}segment_emb_lookup/embedding_table",), copy),
        *_norm("embeddings.layer_norm", f"{scope}long_emb_layer_norm"),
        *_norm("embeddings.global_layer_norm", f"{scope}global_emb_layer_norm"),
    ]
    # The pieces whose key and value projections long queries read global tokens with (l2g) and
    # global queries long tokens with (g2l): under share_kv_projections, the query's stream's own.
    long_to_global, global_to_long = ("l2l", "g2g") if share_kv_projections else ("l2g", "g2l")
    for i in range(config.num_hidden_layers):
        block = f"{layers}/fused_att_layer_{i}"
        attention = f"{block}/fused_global_local_att"
        target = f"encoder.layers.{i}"
        rules += _fused(f"{target}.attention.long_qkv", attention, "long_query", "l2l_key", "l2l_value")
        if not config.share_qkv:
            rules += _fused(f"{target}.attention.global_qkv", attention, "global_query", "g2g_key", "g2g_value")
            rules += _fused(f"{target}.attention.long_queries_global_kv", attention,
                            f"{long_to_global}_key", f"{long_to_global}_value")
            rules += _fused(f"{target}.attention.global_queries_long_kv", attention,
                            f"{global_to_long}_key", f"{global_to_long}_value")
        relative_rows = _relative_rows(RelativeIdLayout(config.max_relative_distance))
        for stream, table in (("long", "long_qkv_attention/qkv_relative_attention"), ("global", "global_qkv_attention")):
            rules += [Rule(f"{target}.attention.{stream}_softmax.relative_key", (f"{attention}/{table}/relative_emb_table",), relative_rows),
                      Rule(f"{target}.attention.{stream}_softmax.relative_bias", (f"{attention}/{table}/relative_bias_table",), relative_rows)]
        rules += _dense(f"{target}.attention.long_output", f"{attention}/long_output_projection")
        if not config.share_attention_output:
            rules += _dense(f"{target}.attention.global_output", f"{attention}/global_output_projection")
        rules += _norm(f"{target}.long_attention_norm", f"{block}/layer_norm_0")
        rules += _norm(f"{target}.global_attention_norm", f"{block}/layer_norm_1")
        if config.share_feed_forward:
            shared = f"{layers}/feed_forward_layer_{i}"
            rules += _feed_forward(f"{target}.long_feed_forward", shared)
            # etcmodel shares the feed-forward block's LayerNorm too: both of longdoc's get it.
            rules += _norm(f"{target}.long_output_norm", f"{shared}/layer_norm")
            rules += _norm(f"{target}.global_output_norm", f"{shared}/layer_norm")
        else:
            for stream in ("long", "global"):
                source = f"{layers}/{stream}_feed_forward_layer_{i}"
                rules += _feed_forward(f"{target}.{stream}_feed_forward", source)
                rules += _norm(f"{target}.{stream}_output_norm", f"{source}/layer_norm")
    return rules


def checkpoint_family(folder: Path, checkpoint: TFCheckpoint) -> str:
    """"etc" or "bert" from the config file present and the variables' scope."""
    names = list(checkpoint.entries)
    if (folder / ETC_CONFIG_FILE).is_file() or any(name.startswith(ETC_SCOPE) for name in names):
        return "etc"
    if (folder / BERT_CONFIG_FILE).is_file() or any(name.startswith("bert/") for name in names):
        return "bert"
    return "unknown"


# Per family: its config file, the class that file's fields belong to, and what a checkpoint of it
# given to the other family's converter is told.
FAMILIES = {
    "etc": (ETC_CONFIG_FILE, "EtcConfig", f"an ETC checkpoint ({ETC_CONFIG_FILE}, variables under {ETC_SCOPE}), not "
                                          "RealFormer's; convert it with `longdoc convert etc`"),
    "bert": (BERT_CONFIG_FILE, "BertConfig", f"a BERT-style checkpoint ({BERT_CONFIG_FILE}, variables under bert/), "
                                             "not ETC; RealFormer's are converted by `longdoc convert realformer`, "
                                             "other BERTs lifted by `longdoc lift`"),
}


def open_checkpoint(folder: str | Path, family: str) -> tuple[TFCheckpoint, Path, dict]:
    """The checkpoint in `folder` (or at a prefix), refused when it is of the other family, with the
    path and fields of `family`'s config file, which lies beside it."""
    checkpoint = TFCheckpoint(find_checkpoint(folder))
    folder = checkpoint.prefix.parent
    other = "bert" if family == "etc" else "etc"
    if checkpoint_family(folder, checkpoint) == other:
        raise InputError(f"{folder}: {FAMILIES[other][2]}")
    config_file, config_class, _ = FAMILIES[family]
    config_path = folder / config_file
    if not config_path.is_file():
        raise InputError(f"{config_path}: missing (the checkpoint folder has its {config_class} beside the checkpoint)")
    source_config = read_json(config_path)
    if not isinstance(source_config, dict):
        raise InputError(f"{config_path}: expected a JSON object of {config_class} fields")
    return checkpoint, config_path, source_config


@dataclass
class ConvertedEtc:
    """A converted ETC checkpoint in memory: the model and where its weights came from."""

    model: GlobalLocalModel
    conversion: Conversion
    checkpoint: TFCheckpoint
    source_config: dict


# etcmodel's released code has no pretraining heads, so their variable names in a pretraining
# checkpoint are unknown: they are an error (a converter must not forget a tensor silently) unless
# the user asks for the encoder alone.
OUTSIDE_THE_ENCODER = Dropped(rf"(?!{ETC_SCOPE}).*", f"outside the encoder ({ETC_SCOPE}): a pretraining head "
                                                     "etcmodel's released code does not name, dropped on request")


def read_etc(folder: str | Path, lengths: LengthOptions = LengthOptions(), progress: bool = False,
             conventions: dict = ETC_INPUT_CONVENTIONS, encoder_only: bool = False) -> ConvertedEtc:
    """Read and convert the ETC checkpoint in `folder` (no files written). `encoder_only`: drop every
    variable outside etcmodel's encoder scope (its pretraining heads) instead of refusing them."""
    checkpoint, config_path, source_config = open_checkpoint(folder, "etc")
    config = etc_config_to_longdoc(source_config, config_path, lengths, conventions)
    rules = etc_rules(config, _field(source_config, "share_kv_projections"))
    model = GlobalLocalModel(config)
    shapes = {name: value.shape for name, value in model.state_dict().items()}
    dropped = [*OPTIMIZER_STATE, OUTSIDE_THE_ENCODER] if encoder_only else OPTIMIZER_STATE
    try:
        conversion = fill(checkpoint, rules, dropped, shapes, "ETC", progress=progress)
    except UnreadVariables as error:
        if all(name.startswith(ETC_SCOPE) for name in error.names):
            raise
        raise OptionError("{error}; to convert the encoder alone and drop what lies outside {scope}, give "
                          "{encoder_only}", error=error, scope=ETC_SCOPE) from None
    model.load_state_dict(conversion.state, strict=True)
    return ConvertedEtc(model, conversion, checkpoint, source_config)


def etcmodel_inputs(inputs, long_valid: np.ndarray, global_valid: np.ndarray) -> dict:
    """GlobalLocalModel.forward's arguments for the arrays etcmodel's EtcModel received (`inputs`:
    token_ids, global_token_ids, segment_ids, global_segment_ids, sentence_ids, long_example_ids,
    global_example_ids) and the real tokens (`long_valid`, `global_valid`). etcmodel gives padding
    sentence id 0; longdoc's "no link" is -1."""
    import torch

    tensor = lambda array: torch.tensor(np.asarray(array), dtype=torch.long)  # noqa: E731
    long_mask = tensor(long_valid)
    return dict(
        long_input_ids=tensor(inputs["token_ids"]), global_input_ids=tensor(inputs["global_token_ids"]),
        long_attention_mask=long_mask, global_attention_mask=tensor(global_valid),
        long_token_type_ids=tensor(inputs["segment_ids"]), global_token_type_ids=tensor(inputs["global_segment_ids"]),
        sentence_ids=torch.where(long_mask.bool(), tensor(inputs["sentence_ids"]), -1),
        long_example_ids=tensor(inputs["long_example_ids"]), global_example_ids=tensor(inputs["global_example_ids"]),
    )


def etc_notes(config: GlobalLocalConfig, tokenizer) -> str:
    ids = config.global_token_ids
    return f"""The encoder computes what etcmodel's `EtcModel` computes, with
etcmodel's relative ids (`input_utils`: longdoc's linked/unlinked long-global ids are etcmodel's
swapped, and so are the two rows of each relative table here) and `hard_g2l` as the checkpoint was
trained. Its config carries etcmodel's input conventions, which longdoc's feature builders follow:
token type 1 for every long token and 0 for every global one, and etcmodel's global token ids
(sentence {ids['sentence']}, CPC-masked sentence {ids['cpc_mask']}, question {ids['question']}, \
candidate {ids['candidate']}, paragraph {ids['paragraph']}; DOM node {ids['dom_node']}); CLS is the \
tokenizer's `{tokenizer.cls_token}` ({tokenizer.cls_token_id}). Rows that pack several examples take \
etcmodel's example ids as `long_example_ids` / `global_example_ids`. Residual attention and talking
heads are off: ETC has neither."""


def convert_etc(folder: str | Path, out: str | Path, lengths: LengthOptions = LengthOptions(),
                vocab: str | Path | None = None, lower_case: bool = True, progress: bool = False,
                encoder_only: bool = False) -> dict:
    """Convert the ETC checkpoint folder `folder` into the longdoc model folder `out`, written atomically.

    The vocabulary's kind (BERT's WordPiece for the base checkpoints, SentencePiece for the large
    ones) decides the input conventions.

    Args:
        folder: the TF checkpoint folder (or a checkpoint prefix in it, `DIR/model.ckpt-N`).
        out: the model folder written; it must not exist, or be an empty folder.
        lengths: the input lengths the converted model accepts (the checkpoint does not fix them).
        vocab: the vocabulary file; None: the folder's one vocabulary (`find_vocabulary`).
        lower_case: lower-case text before WordPiece (ignored for SentencePiece).
        progress: show a progress bar over the bytes read.
        encoder_only: drop every variable outside etcmodel's encoder scope (its pretraining heads)
            instead of refusing them, as in `read_etc`.

    Returns:
        The conversion summary (`conversion_summary`).

    Raises:
        InputError: a checkpoint, config or vocabulary that cannot be converted, naming the file.
        OptionError: `out` not empty, no single vocabulary to choose, or variables outside the
            encoder's scope without `encoder_only`.
    """
    from longdoc.convert.tf_conversion import save_converted
    from longdoc.convert.vocabulary import find_vocabulary, is_sentencepiece, read_vocabulary
    from longdoc.model.pretraining import HEADS_FILE

    out = Path(out)
    refuse_existing(out)
    prefix = find_checkpoint(folder)
    folder = prefix.parent
    vocabulary = find_vocabulary(folder, None if vocab is None else Path(vocab))
    sentencepiece = is_sentencepiece(vocabulary)
    converted = read_etc(prefix, lengths, progress=progress, conventions=input_conventions(sentencepiece),
                         encoder_only=encoder_only)
    tokenizer, vocabulary = read_vocabulary(folder, vocabulary, lower_case, lengths.long_max_len,
                                            converted.model.config.vocab_size, ETC_SENTENCEPIECE_TOKENS)
    if sentencepiece:
        for token_id, piece in ETC_SENTENCEPIECE_IDS.items():
            if tokenizer.convert_ids_to_tokens(token_id) != piece:
                raise InputError(f"{vocabulary}: id {token_id} is {tokenizer.convert_ids_to_tokens(token_id)!r}; "
                                 f"expected {piece!r} (etcmodel's SentencePiece vocabulary)")
    summary = conversion_summary("etc", folder, out, converted.checkpoint, converted.conversion, vocabulary, [])
    card = model_card(out.name, summary, converted.source_config, ETC_CONFIG_FILE,
                      etc_notes(converted.model.config, tokenizer))
    save_converted(out, converted.model, tokenizer, card, None, HEADS_FILE)
    return summary
