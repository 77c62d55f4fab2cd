"""Reading a BERT-family encoder checkpoint (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA,
DistilBERT, MiniLM; transformers format) as data.

Only what weight lifting needs: the config's shape fields and the encoder's weights under their
BERT names, with any task prefix ("bert.", "roberta.", "distilbert.") removed. Nothing of the source
model's code runs. A checkpoint that is not BERT-like is refused with a message that names what is missing.

An extractive QA reader (config.json `architectures`: one of READER_ARCHITECTURES) also yields its
span head: `qa_outputs`, a Linear hidden -> 2 whose outputs are the start and end logits. A QA
architecture whose encoder does not map onto BERT's (DeBERTa, ALBERT, ...) is refused by name.

Weights are read from safetensors only (`model.safetensors`, or the shards listed in
`model.safetensors.index.json`). A `pytorch_model.bin` is refused rather than loaded: reading it
means unpickling, which can run code hidden in the file; the message says how to convert it once.
"""

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from longdoc.errors import InputError, OptionError
from longdoc.model.encoder_folder import readable_weights

# The fields of a BERT-family config that give a GlobalLocalConfig its shapes, under the same names.
BERT_SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")

# RoBERTa and its descendants (fairseq's convention) number real tokens from padding_idx + 1, so
# their first token reads row pad_token_id + 1 of the position table; BERT's reads row 0.
ROBERTA_FAMILY = ("roberta", "xlm-roberta", "camembert")
# ELECTRA's discriminator is BERT's encoder under other names only where its embeddings are as wide
# as its hidden states (base, large); a narrower embedding (small) adds a projection BERT lacks.
SUPPORTED_MODEL_TYPES = ("bert", "electra", "distilbert") + ROBERTA_FAMILY

# DistilBERT is BERT's post-LN encoder under its own names, without token types: its config fields
# and layer weights are read under BERT's names, and its token-type table is one row of zeros.
DISTILBERT_CONFIG_FIELDS = {
    "dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
    "hidden_dim": "intermediate_size", "activation": "hidden_act", "dropout": "hidden_dropout_prob",
    "attention_dropout": "attention_probs_dropout_prob",
}
DISTILBERT_FIXED_FIELDS = {"layer_norm_eps": 1e-12, "type_vocab_size": 1}  # fixed in DistilBERT's code
DISTILBERT_LAYER_MODULES = {
    "attention.q_lin": "attention.self.query", "attention.k_lin": "attention.self.key",
    "attention.v_lin": "attention.self.value", "attention.out_lin": "attention.output.dense",
    "sa_layer_norm": "attention.output.LayerNorm", "ffn.lin1": "intermediate.dense", "ffn.lin2": "output.dense",
    "output_layer_norm": "output.LayerNorm",
}
_DISTILBERT_LAYER_WEIGHT = re.compile(r"transformer\.layer\.(\d+)\.(.+)\.(weight|bias)")

# The transformers QA classes whose encoder is a supported one and whose span head is `qa_outputs`.
READER_ARCHITECTURES = (
    "BertForQuestionAnswering", "RobertaForQuestionAnswering", "XLMRobertaForQuestionAnswering",
    "CamembertForQuestionAnswering", "ElectraForQuestionAnswering", "DistilBertForQuestionAnswering",
)
READER_HEAD = "qa_outputs"

REQUIRED_CONFIG_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "hidden_act", "max_position_embeddings", "type_vocab_size", "layer_norm_eps",
)

# Per-layer weights of a BERT encoder layer, relative to "encoder.layer.{i}.".
LAYER_WEIGHTS = tuple(
    f"{module}.{parameter}"
    for module in (
        "attention.self.query", "attention.self.key", "attention.self.value",
        "attention.output.dense", "attention.output.LayerNorm",
        "intermediate.dense", "output.dense", "output.LayerNorm",
    )
    for parameter in ("weight", "bias")
)
EMBEDDING_WEIGHTS = (
    "embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
    "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias",
)

# Writes DIR/model.safetensors from DIR/pytorch_model.bin under the same tensor names; weights_only
# loading refuses pickled code, and the clones undo the sharing of tied tensors, which safetensors refuses.
CONVERT_TO_SAFETENSORS = (
    "python -c \"import sys, torch; from safetensors.torch import save_file; d = sys.argv[1]; "
    "save_file({k: v.clone().contiguous() for k, v in "
    "torch.load(d + '/pytorch_model.bin', weights_only=True).items()}, d + '/model.safetensors', "
    "metadata={'format': 'pt'})\""
)


@dataclass
class BertCheckpoint:
    """A BERT-family encoder read from `directory`.

    `weights` holds every encoder weight under its bare BERT name ("encoder.layer.0.attention.self.query.weight"),
    `unused` the source tensors lifting has no counterpart for (pooler, task heads, position_ids).
    `position_offset` is the position-table row of the first token (0 for BERT, pad + 1 for RoBERTa).
    `weight_files` maps each safetensors file name to its sha256, so a lift can be traced to its source.
    For a QA reader, `architecture` is its class (e.g. "BertForQuestionAnswering") and `span_head`
    its `qa_outputs` {"weight": [2, H], "bias": [2]} (start, end); both None for a bare encoder.
    """

    directory: Path
    config: dict
    weights: dict[str, torch.Tensor]
    unused: list[str]
    position_offset: int
    weight_files: dict[str, str]
    architecture: str | None = None
    span_head: dict[str, torch.Tensor] | None = None

    @property
    def model_type(self) -> str:
        return self.config["model_type"]

    @property
    def usable_positions(self) -> int:
        """Rows of the position table that real tokens can reach (512 for BERT and RoBERTa)."""
        return self.config["max_position_embeddings"] - self.position_offset


def locate_checkpoint(source: str) -> Path:
    """The local folder of `source`: a directory, or a hub id fetched where a hub is reachable."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists():
        raise OptionError("{from} {source}: not a directory (give the folder that holds config.json)", source=source)
    # A hub id is "name" or "owner/name"; anything else was meant as a local path.
    if path.is_absolute() or source.startswith((".", "~")) or source.count("/") > 1:
        raise OptionError("{from} {source}: no such directory", source=source)
    from huggingface_hub import snapshot_download

    try:
        fetched = snapshot_download(source, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"])
    except Exception as error:  # offline, unknown id, malformed id: all mean "cannot use this source"
        raise OptionError("{from} {source}: no such directory, and the hub could not provide it ({kind}: {error})",
                          source=source, kind=type(error).__name__, error=error) from None
    return Path(fetched)


def read_checkpoint(directory: str | Path) -> BertCheckpoint:
    """Read and validate a BERT-family checkpoint folder; InputError names what is missing or wrong."""
    directory = Path(directory)
    config = _read_config(directory)
    tensors, weight_files = _read_weights(directory)
    prefix = _encoder_prefix(directory, tensors)
    required = list(EMBEDDING_WEIGHTS) + [
        f"encoder.layer.{layer}.{name}" for layer in range(config["num_hidden_layers"]) for name in LAYER_WEIGHTS
    ]
    required_set = set(required)
    architecture = _reader_architecture(config)
    span_head = _read_span_head(directory, config, architecture, tensors)
    weights: dict[str, torch.Tensor] = {}
    unused: list[str] = []
    for name, tensor in tensors.items():
        if span_head is not None and name.startswith(READER_HEAD + "."):
            continue
        bare_name = _bert_name(name[len(prefix):], config["model_type"]) if name.startswith(prefix) else None
        if bare_name in required_set:
            weights[bare_name] = tensor
        else:
            unused.append(name)
    if config["model_type"] == "distilbert":
        weights["embeddings.token_type_embeddings.weight"] = torch.zeros(1, config["hidden_size"])
    missing = [name for name in required if name not in weights]
    if missing:
        shown = ", ".join(prefix + name for name in missing[:6])
        more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        raise InputError(f"{directory}: not a complete BERT-like encoder: missing weights {shown}{more}")

    position_offset = config["pad_token_id"] + 1 if config["model_type"] in ROBERTA_FAMILY else 0
    if config["max_position_embeddings"] <= position_offset:
        raise InputError(
            f"{directory}/config.json: max_position_embeddings ({config['max_position_embeddings']}) leaves no "
            f"positions after the {config['model_type']} offset {position_offset}"
        )
    return BertCheckpoint(directory, config, weights, sorted(unused), position_offset, weight_files, architecture,
                          span_head)


def _read_config(directory: Path) -> dict:
    path = directory / "config.json"
    if not path.is_file():
        raise InputError(f"{directory}: no config.json (not a transformers checkpoint folder)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise InputError(f"{path}:{error.lineno}:{error.colno}: not valid JSON: {error.msg}") from None
    if not isinstance(config, dict):
        raise InputError(f"{path}: not a JSON object")
    _refuse_unsupported_reader(path, config)
    model_type = config.get("model_type")
    if model_type == "distilbert":
        config = {**config, **DISTILBERT_FIXED_FIELDS,
                  **{bert: config[own] for own, bert in DISTILBERT_CONFIG_FIELDS.items() if own in config}}
    missing = [name for name in REQUIRED_CONFIG_FIELDS if name not in config]
    if model_type not in SUPPORTED_MODEL_TYPES:
        lacking = f"; it lacks the BERT fields {', '.join(missing)}" if missing else ""
        raise InputError(
            f"{path}: model_type {model_type!r} is not BERT-like (supported: {', '.join(SUPPORTED_MODEL_TYPES)}){lacking}"
        )
    if missing:
        raise InputError(f"{path}: missing BERT config fields {', '.join(missing)}")
    # Other position schemes (BERT's relative_key variants) have weights lifting cannot map.
    position_type = config.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise InputError(f"{path}: position_embedding_type {position_type!r} is not supported (only 'absolute')")
    if model_type == "electra" and config.get("embedding_size", config["hidden_size"]) != config["hidden_size"]:
        raise InputError(
            f"{path}: embedding_size {config['embedding_size']} differs from hidden_size {config['hidden_size']}; "
            "only ELECTRA models whose embeddings are as wide as their hidden states (base, large) can be lifted"
        )
    config.setdefault("pad_token_id", 0)
    return config


def _question_answering_architectures(config: dict) -> list[str]:
    architectures = config.get("architectures") or []
    return [name for name in architectures if isinstance(name, str) and "ForQuestionAnswering" in name]


def _refuse_unsupported_reader(path: Path, config: dict) -> None:
    """A QA checkpoint of another family is refused by its architecture, before its model_type is
    read: the user learns which readers can be lifted, not that a DeBERTa is not BERT-like."""
    for name in _question_answering_architectures(config):
        if name not in READER_ARCHITECTURES:
            raise InputError(
                f"{path}: architecture {name} cannot be lifted (its encoder does not map onto BERT's); "
                f"supported QA readers: {', '.join(READER_ARCHITECTURES)}"
            )


def _reader_architecture(config: dict) -> str | None:
    readers = _question_answering_architectures(config)
    return readers[0] if readers else None


def _read_span_head(
    directory: Path, config: dict, architecture: str | None, tensors: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor] | None:
    """A reader's `qa_outputs` as {"weight", "bias"}, checked to be a Linear hidden -> 2; None for an encoder."""
    if architecture is None:
        return None
    names = {part: f"{READER_HEAD}.{part}" for part in ("weight", "bias")}
    missing = [name for name in names.values() if name not in tensors]
    if missing:
        raise InputError(f"{directory}: config.json names {architecture}, but the weights lack its span head "
                         f"({', '.join(missing)})")
    weight, bias = tensors[names["weight"]], tensors[names["bias"]]
    if weight.dim() != 2 or weight.shape[0] != 2 or bias.shape != (2,):
        raise InputError(
            f"{directory}: {names['weight']} has shape {tuple(weight.shape)} and {names['bias']} "
            f"{tuple(bias.shape)}; a QA reader's span head has two outputs (start and end logits): expected "
            "[2, hidden] and [2]"
        )
    if weight.shape[1] != config["hidden_size"]:
        raise InputError(f"{directory}: {names['weight']} has shape {tuple(weight.shape)}, but config.json's "
                         f"hidden_size is {config['hidden_size']}: expected [2, {config['hidden_size']}]")
    return {"weight": weight, "bias": bias}


def _read_weights(directory: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        file_names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    elif (directory / "model.safetensors").is_file():
        file_names = ["model.safetensors"]
    elif (directory / "pytorch_model.bin").is_file():
        raise InputError(
            f"{directory}: only pytorch_model.bin found; longdoc reads safetensors only, because loading a .bin "
            "file unpickles it. Convert it once where you trust the file, keeping every tensor (a QA reader's "
            f"head too): {CONVERT_TO_SAFETENSORS} DIR (writes DIR/model.safetensors)"
        )
    else:
        raise InputError(f"{directory}: no model.safetensors (or model.safetensors.index.json) weights file")
    tensors: dict[str, torch.Tensor] = {}
    digests: dict[str, str] = {}
    for name in file_names:
        path = directory / name
        if not path.is_file():
            raise InputError(f"{index}: lists weight file {name}, which is missing")
        digests[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        with readable_weights(path):
            tensors.update(load_file(path))
    return tensors, digests


def _encoder_prefix(directory: Path, tensors: dict[str, torch.Tensor]) -> str:
    """"" for a bare encoder, "bert." or "roberta." for a checkpoint saved with a task head."""
    anchor = "embeddings.word_embeddings.weight"
    prefixes = sorted(name[: -len(anchor)] for name in tensors if name.endswith(anchor))
    if not prefixes:
        raise InputError(f"{directory}: not a BERT-like encoder: no weight named *{anchor}")
    return prefixes[0]


def _bert_name(name: str, model_type: str) -> str:
    """A source weight's name (task prefix removed) as BERT names it."""
    if model_type == "distilbert":
        match = _DISTILBERT_LAYER_WEIGHT.fullmatch(name)
        if match and match.group(2) in DISTILBERT_LAYER_MODULES:
            layer, module, parameter = match.groups()
            return f"encoder.layer.{layer}.{DISTILBERT_LAYER_MODULES[module]}.{parameter}"
    return _modern_layer_norm_name(name)


def _modern_layer_norm_name(name: str) -> str:
    # Checkpoints converted from the original TensorFlow BERT call LayerNorm's scale and shift gamma, beta.
    if ".LayerNorm." in name:
        return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
    return name
