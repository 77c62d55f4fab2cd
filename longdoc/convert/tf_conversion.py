"""Filling a longdoc model from a TF checkpoint by explicit rules, so that no variable is forgotten.

A converter (longdoc.convert.etc, longdoc.convert.realformer) states, for its checkpoint family:
- `Rule`s: each longdoc parameter and the TF variables it is made from (a dense kernel transposed,
  three projections concatenated into one fused Q/K/V, a table copied);
- `Dropped` variables: read by nothing on purpose (optimizer slots, the step counter, a head
  longdoc does not have), each with the reason, which the model card lists.

`check_coverage` refuses a checkpoint with a variable no rule or drop names (a converter that
forgets a tensor must not pass) and one that lacks a variable a rule needs. `fill` reads the
variables rule by rule, checks shapes against the model, and returns the state dict.
`save_converted` writes the model, the tokenizer (longdoc.convert.vocabulary: a WordPiece vocab.txt
or a SentencePiece model), the pretraining heads and the model card (`model_card`, from
`conversion_summary`) into a folder built beside --out and renamed into place
(`longdoc.model_folder.write_new_folder`), so nothing half-written is left there.
"""

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
from tqdm.auto import tqdm

from longdoc.model_folder import save_model, write_new_folder
from longdoc.convert.tf_checkpoint import TFCheckpoint
from longdoc.errors import InputError


# etcmodel's and RealFormer's "gelu" is the tanh approximation (tensor_utils.gelu), which is
# transformers' "gelu_new"; longdoc's "gelu" is the exact erf form.
ACTIVATIONS = {"gelu": "gelu_new", "relu": "relu", "tanh": "tanh"}


@dataclass(frozen=True)
class Rule:
    """`target` (a longdoc parameter name) = combine(values of `sources`, in order)."""

    target: str
    sources: tuple[str, ...]
    combine: Callable[[list[np.ndarray]], np.ndarray]


@dataclass(frozen=True)
class Dropped:
    """TF variables matching `pattern` (a full-match regex), read by nothing, and why."""

    pattern: str
    reason: str


# Optimizer state and the step counter: not model weights. etcmodel trains with LAMB
# (`VAR/lamb_m`, `VAR/lamb_v`); BERT-style code with Adam (`VAR/adam_m`, `VAR/adam_v`, or TF's
# `VAR/Adam`, `VAR/Adam_1`, `beta1_power`, `beta2_power`).
OPTIMIZER_STATE = [
    Dropped(r".+/(lamb|adam)_[mv]|.+/Adam(_1)?|beta[12]_power", "optimizer state (LAMB/Adam moments), not a weight"),
    Dropped(r"global_step", "the training step counter, not a weight"),
]


def copy(values: list[np.ndarray]) -> np.ndarray:
    (value,) = values
    return value


def dense_weight(values: list[np.ndarray]) -> np.ndarray:
    """A TF dense kernel [in, out] -> a torch Linear weight [out, in]."""
    (kernel,) = values
    return kernel.T


def fused_weight(values: list[np.ndarray]) -> np.ndarray:
    """Query, key and value kernels [in, out] -> one fused weight [3 out, in], rows q, k, v."""
    return np.concatenate([kernel.T for kernel in values])


def fused_bias(values: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(values)


@dataclass
class Conversion:
    """What was done: the filled state, the variables read and dropped (for the model card and the
    --json summary)."""

    state: dict[str, torch.Tensor] = field(default_factory=dict)
    read: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)  # variable -> reason


class UnreadVariables(InputError):
    """A checkpoint holds variables no rule reads and no drop names (`names`)."""

    def __init__(self, message: str, names: list[str]):
        super().__init__(message)
        self.names = names


def check_coverage(checkpoint: TFCheckpoint, rules: Iterable[Rule], dropped: Iterable[Dropped],
                   what: str) -> dict[str, str]:
    """Refuse a checkpoint that lacks a variable the rules need, or has one nothing accounts for.
    Returns the dropped variables with their reasons."""
    needed = {source for rule in rules for source in rule.sources}
    missing = sorted(needed - set(checkpoint.entries))
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise InputError(f"{checkpoint.index_path}: not {what} with this config: lacks {shown}")
    drops = {}
    unread = []
    for name in sorted(set(checkpoint.entries) - needed):
        reason = next((drop.reason for drop in dropped if re.fullmatch(drop.pattern, name)), None)
        if reason is None:
            unread.append(name)
        else:
            drops[name] = reason
    if unread:
        shown = ", ".join(unread[:5]) + (f" and {len(unread) - 5} more" if len(unread) > 5 else "")
        raise UnreadVariables(f"{checkpoint.index_path}: variables that no rule of the {what} converter reads: "
                              f"{shown} (a checkpoint of another kind, or a head this converter does not know)", unread)
    return drops


def fill(checkpoint: TFCheckpoint, rules: list[Rule], dropped: list[Dropped], expected: dict[str, torch.Size],
         what: str, progress: bool = False) -> Conversion:
    """The state dict for parameters `expected` from `checkpoint` by `rules`.

    The coverage is checked first (`check_coverage`), then the variables are read rule by rule and
    each result's shape checked against the model's.

    Args:
        checkpoint: the TF checkpoint read.
        rules: each parameter and the variables it is made from; their targets must be exactly the
            names of `expected`.
        dropped: the variables read by nothing on purpose, with their reasons.
        expected: the model's parameters, name -> shape.
        what: the checkpoint family, e.g. "ETC", named in the messages.
        progress: show a progress bar over the bytes read.

    Returns:
        Conversion: the filled state (float32 tensors), the variables read and those dropped.

    Raises:
        InputError: a variable a rule needs is missing, or a result's shape differs from the model's.
        UnreadVariables: the checkpoint holds variables no rule reads and no drop names.
        RuntimeError: the rules and the model disagree (a converter bug, not bad input).
    """
    conversion = Conversion(dropped=check_coverage(checkpoint, rules, dropped, what))
    targets = {rule.target for rule in rules}
    if targets != set(expected):
        # A converter bug, not bad input: its rules and the model it builds disagree.
        raise RuntimeError(f"{what} rules and the model disagree: no rule for {sorted(set(expected) - targets)}, "
                           f"rules for unknown parameters {sorted(targets - set(expected))}")
    total = sum(checkpoint.entries[source].size for rule in rules for source in rule.sources)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"reading {checkpoint.index_path.parent.name}",
              disable=not progress) as bar:
        for rule in rules:
            values = [checkpoint.read(source) for source in rule.sources]
            value = np.require(rule.combine(values), np.float32, ["C_CONTIGUOUS", "WRITEABLE"])
            if value.shape != tuple(expected[rule.target]):
                shapes = ", ".join(f"{source} {tuple(v.shape)}" for source, v in zip(rule.sources, values))
                raise InputError(f"{checkpoint.index_path}: {shapes} give {rule.target} the shape {value.shape}, "
                                 f"but the config asks for {tuple(expected[rule.target])} (the config and the weights disagree)")
            conversion.state[rule.target] = torch.from_numpy(value)
            conversion.read.extend(source for source in rule.sources if source not in conversion.read)
            bar.update(sum(checkpoint.entries[source].size for source in rule.sources))
    return conversion


def save_converted(out: Path, model, tokenizer, card: str, heads: dict[str, torch.Tensor] | None,
                   heads_file: str) -> Path:
    """Write the model, tokenizer, model card and the pretraining heads (if any) to `out`, atomically.

    Args:
        out: the model folder written; it must not exist, or be an empty folder.
        model: the converted model, written as safetensors + config.json.
        tokenizer: the checkpoint's tokenizer.
        card: the model card's text (`model_card`).
        heads: the pretraining heads' tensors by name; None or empty: no heads file.
        heads_file: the file name the heads are written to.

    Returns:
        The folder written.

    Raises:
        OptionError: `out` exists and is not an empty folder.
    """
    def write(folder: Path) -> None:
        save_model(folder, model, tokenizer, card=card, extra_weights={heads_file: heads} if heads else None)

    return write_new_folder(out, write)


def conversion_summary(family: str, source: Path, out: Path, checkpoint: TFCheckpoint, conversion: Conversion,
                       vocabulary: Path, heads: list[str]) -> dict:
    """What `longdoc convert --json` prints, and what the model card lists.

    Args:
        family: the converter's name ("etc", "realformer").
        source: the checkpoint folder.
        out: the model folder written.
        checkpoint: the TF checkpoint read.
        conversion: what `fill` did: the variables read and dropped, the parameters filled.
        vocabulary: the vocabulary file.
        heads: the names of the pretraining heads converted.

    Returns:
        A dict of JSON values: family, source, checkpoint (its prefix's name), out, vocabulary (its
        file name), variables_read, bytes_read, parameters, pretraining_heads and dropped (variable
        -> reason).
    """
    return {
        "family": family,
        "source": str(source),
        "checkpoint": checkpoint.prefix.name,
        "out": str(out),
        "vocabulary": vocabulary.name,
        "variables_read": len(conversion.read),
        "bytes_read": sum(checkpoint.entries[name].size for name in conversion.read),
        "parameters": len(conversion.state),
        "pretraining_heads": heads,
        "dropped": conversion.dropped,
    }


def model_card(title: str, summary: dict, source_config: dict, config_file: str, notes: str) -> str:
    config_rows = "\n".join(f"| `{key}` | `{json.dumps(value)}` |" for key, value in sorted(source_config.items()))
    reasons: dict[str, int] = {}
    for reason in summary["dropped"].values():
        reasons[reason] = reasons.get(reason, 0) + 1
    dropped = "\n".join(f"- {count} variable(s): {reason}" for reason, count in reasons.items()) or "- none"
    heads = ", ".join(f"`{name}`" for name in summary["pretraining_heads"]) or "none"
    return f"""# {title}

A longdoc global-local encoder converted by `longdoc convert {summary['family']}` from Google's TF checkpoint
`{summary['checkpoint']}` in `{summary['source']}` ({summary['variables_read']} variables,
{summary['bytes_read']:,} bytes read; vocabulary `{summary['vocabulary']}`).

{notes}

## Source config (`{config_file}`)

| field | value |
| --- | --- |
{config_rows}

## Variables not converted
{dropped}

Pretraining heads converted: {heads}.

## Use

```python
from transformers import AutoTokenizer
from longdoc import GlobalLocalModel

model = GlobalLocalModel.from_pretrained("{title}")
tokenizer = AutoTokenizer.from_pretrained("{title}")
```
"""
