"""The encoder's inputs, written once, and their checks before any compute.

The checks. `check_and_collect` (in `GlobalLocalModel.forward`) checks names, shapes and dtypes,
which reads no tensor; the checks of values (ids inside their vocabularies, links to real global
tokens) read every input, a host synchronisation on a GPU that also stops torch.compile and export,
so they run where batches are collated: `check_encoder_inputs(batch, config)`, which
`TaskModel.forward_rows` and the training engine call on each batch before it leaves the CPU.
Forward runs them too when its inputs are on the CPU and no tracing is under way, so that a model
called directly still refuses bad values with a clear error, except inside `checked_batches()`,
where the caller says it has checked every batch it gives the model: the training engine's steps,
so that a batch is checked once, where it is made. (A mark inside the batch would not reach the
encoder: `model(**batch)` spreads it over a task model's keywords, and `encode` passes on the
encoder's inputs only.)

The schema. `ENCODER_INPUTS` holds one `InputSpec` per `GlobalLocalModel.forward` argument, in
argument order: its name, its axes, its dtype in a batch and the value that pads it. Axes are
named: "batch" (B), "long" (L, long tokens), "global" (G, global tokens), "feature"
(F = config.global_feature_size). Everything that handles model inputs reads them from here:
`longdoc.data.features.Features` (its fields with these names are the model inputs),
`longdoc.data.batching.collate_features` (which pads by spec), `check_and_collect` below, and the
forward docstring (a test holds it to the schema). `MODEL_INPUT_NAMES` lists the names.

Labels and other per-window tensors of a task use the same class, so a task collates its labels
with the same function that collates the encoder inputs:

    import torch
    from longdoc.data.batching import collate_features
    from longdoc.model.heads import IGNORE_INDEX
    from longdoc.model.inputs import InputSpec

    LABELS = (
        InputSpec("start_positions", ("batch",), torch.long),                          # a number per row
        InputSpec("supporting_labels", ("batch", "global"), torch.long, pad=IGNORE_INDEX),  # one per global
        InputSpec("answer_spans", ("batch", "answer", 2), torch.long, pad=IGNORE_INDEX),  # a task's own axis
    )

    def collate(rows, pad_token_id):
        return collate_features(rows, pad_token_id, extra=LABELS)   # model(**batch) / task model

Rules `collate_features` applies to every spec (encoder inputs and extras alike):
- A row holds one value per spec as nested lists (or a tensor) with one level per axis after
  "batch"; an axis given as an int has that fixed size. A spec whose name the first row lacks
  (or holds as None) is left out of the batch (labels at prediction time, `global_features`
  without DOM features); all rows must then agree.
- A named axis has one size per row across all specs that use it (a row whose `sentence_ids` is
  not as long as its `long_input_ids` is refused, naming the row and field), and the batch pads
  it to its longest row, with each spec's `pad`; so "long"/"global" labels line up with the inputs.
- `pad=PAD_TOKEN_ID` pads with the tokenizer's pad id, given to `collate_features`.
- Values are converted to the spec's dtype.
`encoder_inputs(batch)` picks the encoder's inputs out of a batch that also holds labels.

transformers' names. A tokenizer's output names a plain encoder's inputs `input_ids`,
`attention_mask` and `token_type_ids`; `INPUT_ALIASES` takes them as the long input's, so
`model(**tokenizer(question, context, return_tensors="pt"))` runs the encoder with no global tokens, as
it runs a BERT. `take_aliases` renames them (forward and `TaskModel.encode` call it); a name given
together with its alias is refused.
"""

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import torch
from torch import Tensor

from longdoc.model.config import GlobalLocalConfig
from longdoc.model.side_inputs import StructureIds

# The pad value that stands for "the tokenizer's pad id", known only when collating.
PAD_TOKEN_ID = "pad_token_id"

_AXIS_LETTERS = {"batch": "B", "long": "L", "global": "G", "feature": "F"}


@dataclass(frozen=True)
class InputSpec:
    """One batched tensor: its name, axes (the first is always "batch"), dtype and padding value."""

    name: str
    axes: tuple[str | int, ...]
    dtype: torch.dtype
    pad: int | float | bool | str = 0

    def __post_init__(self):
        if not self.axes or self.axes[0] != "batch":
            raise ValueError(f"InputSpec {self.name!r}: axes must start with 'batch', got {self.axes}")
        if isinstance(self.pad, str) and self.pad != PAD_TOKEN_ID:
            raise ValueError(f"InputSpec {self.name!r}: pad must be a number, a bool or PAD_TOKEN_ID, got {self.pad!r}")

    @property
    def shape_text(self) -> str:
        """The shape as the docstrings write it, e.g. "[B, L]"."""
        return "[" + ", ".join(str(_AXIS_LETTERS.get(axis, axis)) for axis in self.axes) + "]"

    def pad_value(self, pad_token_id: int) -> int | float | bool:
        return pad_token_id if self.pad == PAD_TOKEN_ID else self.pad


_LONG, _GLOBAL = ("batch", "long"), ("batch", "global")
ENCODER_INPUTS = (
    InputSpec("long_input_ids", _LONG, torch.long, pad=PAD_TOKEN_ID),
    InputSpec("global_input_ids", _GLOBAL, torch.long, pad=PAD_TOKEN_ID),
    InputSpec("long_attention_mask", _LONG, torch.long, pad=0),
    InputSpec("global_attention_mask", _GLOBAL, torch.long, pad=0),
    InputSpec("long_token_type_ids", _LONG, torch.long, pad=0),
    InputSpec("global_token_type_ids", _GLOBAL, torch.long, pad=0),
    # Structure ids: -1 is "none" (no owner, no paragraph), so padding links to nothing.
    InputSpec("sentence_ids", _LONG, torch.long, pad=-1),
    InputSpec("mention_ids", _LONG, torch.long, pad=-1),
    InputSpec("long_paragraph_ids", _LONG, torch.long, pad=-1),
    InputSpec("global_paragraph_ids", _GLOBAL, torch.long, pad=-1),
    InputSpec("global_sees_all", _GLOBAL, torch.bool, pad=False),
    InputSpec("global_features", ("batch", "global", "feature"), torch.float32, pad=0.0),
    InputSpec("long_example_ids", _LONG, torch.long, pad=-1),
    InputSpec("global_example_ids", _GLOBAL, torch.long, pad=-1),
)
MODEL_INPUT_NAMES = tuple(spec.name for spec in ENCODER_INPUTS)
# Given only for rows that pack several examples (ETC's pretraining); longdoc's features hold one.
PACKED_ROW_INPUTS = ("long_example_ids", "global_example_ids")
# transformers' name of a plain encoder's input -> the long input's (see the module docstring).
INPUT_ALIASES = {"input_ids": "long_input_ids", "attention_mask": "long_attention_mask",
                 "token_type_ids": "long_token_type_ids"}


def take_aliases(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """`inputs` with each of transformers' names (INPUT_ALIASES) given under the long input's name; an
    alias and its long name both given (not None) is a TypeError naming both."""
    renamed = {name: value for name, value in inputs.items() if name not in INPUT_ALIASES}
    for alias, name in INPUT_ALIASES.items():
        if inputs.get(alias) is None:
            continue
        if inputs.get(name) is not None:
            raise TypeError(f"{alias} and {name} were both given: {alias} (transformers' name) is the long input's "
                            f"{name}; give one of them")
        renamed[name] = inputs[alias]
    return renamed


def encoder_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The encoder's inputs in `batch`, a collated batch or one feature row (labels and bookkeeping
    left out, None values dropped)."""
    return {name: batch[name] for name in MODEL_INPUT_NAMES if batch.get(name) is not None}


def batch_shape(batch: Mapping[str, Any]) -> tuple[int, int, int]:
    """(rows, long tokens, global tokens) of a collated batch of encoder inputs."""
    long_input_ids, global_input_ids = batch["long_input_ids"], batch.get("global_input_ids")
    return (long_input_ids.shape[0], long_input_ids.shape[1],
            0 if global_input_ids is None else global_input_ids.shape[1])


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


def _require_dtype(spec: InputSpec, tensor: Tensor) -> None:
    """Integer and bool inputs refuse floats (a 0.5 in a mask or an id is a bug upstream)."""
    if tensor.is_complex() or (spec.dtype != torch.float32 and tensor.is_floating_point()):
        kind = "integers" if spec.dtype == torch.long else "booleans or integers"
        raise ValueError(f"{spec.name} must hold {kind}, got dtype {tensor.dtype}")


# True inside `checked_batches()`: the batches given to forward were checked where they were made.
_BATCHES_CHECKED = contextvars.ContextVar("batches_checked", default=False)


@contextlib.contextmanager
def checked_batches() -> Iterator[None]:
    """Within it, forward leaves the values of its inputs unchecked: the caller has run
    `check_encoder_inputs` on every batch it gives the model. Names, shapes and dtypes are still checked."""
    token = _BATCHES_CHECKED.set(True)
    try:
        yield
    finally:
        _BATCHES_CHECKED.reset(token)


def check_encoder_inputs(batch: Mapping[str, Any], config: GlobalLocalConfig) -> None:
    """Every check of the encoder's inputs in `batch` (a collated batch; other keys are ignored),
    their values included: ValueError naming the input. Call it where batches are collated."""
    check_and_collect(config, encoder_inputs(batch), check_values=True)


def check_and_collect(
    config: GlobalLocalConfig, inputs: Mapping[str, Tensor | None], check_values: bool | None = None
) -> StructureIds:
    """Validate `GlobalLocalModel.forward`'s arguments (by name, None: not given) against the schema
    and the config; return the structure record with defaults filled in. `check_values`: also check
    the values (which reads the tensors); None: where that costs no host synchronisation and stops
    no tracing (inputs on the CPU, neither torch.compile nor export tracing), unless the caller
    checked them where the batch was made (`checked_batches`)."""
    unknown = sorted(set(inputs) - set(MODEL_INPUT_NAMES))
    if unknown:
        raise ValueError(f"unknown encoder input(s) {', '.join(unknown)}; known: {', '.join(MODEL_INPUT_NAMES)}")
    given = {spec.name: inputs[spec.name] for spec in ENCODER_INPUTS if inputs.get(spec.name) is not None}
    long_input_ids = given.get("long_input_ids")
    if long_input_ids is None or long_input_ids.dim() != 2:
        shape = None if long_input_ids is None else tuple(long_input_ids.shape)
        raise ValueError(f"long_input_ids must be a [batch, length] tensor, got shape {shape}")
    batch, length = long_input_ids.shape
    if length == 0:
        raise ValueError("long_input_ids has length 0; at least one long token is needed")
    if length > config.long_max_len:
        raise ValueError(f"long_input_ids has length {length}, above long_max_len = {config.long_max_len}")
    num_globals = _check_globals(config, given, batch)
    if "global_features" in given and config.global_feature_size == 0:
        raise ValueError("global_features was given but config.global_feature_size is 0")
    sizes = {"batch": batch, "long": length, "global": num_globals, "feature": config.global_feature_size}
    for spec in ENCODER_INPUTS:
        if spec.name in given:
            _require_shape(spec.name, given[spec.name], tuple(sizes[axis] for axis in spec.axes))
    for spec in ENCODER_INPUTS:
        if spec.name in given:
            _require_dtype(spec, given[spec.name])
    if "mention_ids" in given and "sentence_ids" not in given:
        raise ValueError("mention_ids was given without sentence_ids")
    long_example_ids, global_example_ids = given.get("long_example_ids"), given.get("global_example_ids")
    if (long_example_ids is None) != (global_example_ids is None) and num_globals > 0:
        given_name = "long_example_ids" if global_example_ids is None else "global_example_ids"
        raise ValueError(f"{given_name} was given alone; rows packed with several examples need both "
                         "long_example_ids and global_example_ids")

    device = long_input_ids.device
    long_attention_mask, global_attention_mask = given.get("long_attention_mask"), given.get("global_attention_mask")
    long_mask = (long_attention_mask != 0) if long_attention_mask is not None else torch.ones(
        (batch, length), dtype=torch.bool, device=device
    )
    global_mask = (global_attention_mask != 0) if global_attention_mask is not None else torch.ones(
        (batch, num_globals), dtype=torch.bool, device=device
    )
    if check_values is None:
        check_values = device.type == "cpu" and not torch.compiler.is_compiling() and not _BATCHES_CHECKED.get()
    if check_values:
        _check_values(config, given, num_globals, long_mask, global_mask)
    global_sees_all = given.get("global_sees_all")
    return StructureIds(
        long_mask=long_mask,
        global_mask=global_mask,
        sentence_ids=given.get("sentence_ids"),
        mention_ids=given.get("mention_ids"),
        long_paragraph_ids=given.get("long_paragraph_ids"),
        global_paragraph_ids=given.get("global_paragraph_ids"),
        global_sees_all=None if global_sees_all is None else global_sees_all.bool(),
        long_example_ids=long_example_ids,
        global_example_ids=global_example_ids,
    )


def _check_globals(config: GlobalLocalConfig, given: Mapping[str, Tensor], batch: int) -> int:
    """The number of global tokens (0 without global_input_ids, when no global input may be given)."""
    global_input_ids = given.get("global_input_ids")
    if global_input_ids is None:
        for spec in ENCODER_INPUTS:
            if "global" in spec.axes and spec.name in given:
                raise ValueError(f"{spec.name} was given but global_input_ids is None (no global tokens)")
        return 0
    if global_input_ids.dim() != 2 or global_input_ids.shape[0] != batch:
        raise ValueError(f"global_input_ids has shape {tuple(global_input_ids.shape)}, expected [{batch}, num_globals]")
    num_globals = global_input_ids.shape[1]
    if num_globals > config.global_max_len:
        raise ValueError(f"global_input_ids has {num_globals} global tokens, above global_max_len = {config.global_max_len}")
    return num_globals


def _check_values(config: GlobalLocalConfig, given: Mapping[str, Tensor], num_globals: int, long_mask: Tensor,
                  global_mask: Tensor) -> None:
    """Ids inside their vocabularies; sentence and mention ids that name a real global token or none."""
    vocab = f"vocab_size = {config.vocab_size}"
    _require_range("long_input_ids", given.get("long_input_ids"), 0, config.vocab_size, vocab)
    _require_range("global_input_ids", given.get("global_input_ids"), 0, config.vocab_size, vocab)
    types = f"type_vocab_size = {config.type_vocab_size}"
    _require_range("long_token_type_ids", given.get("long_token_type_ids"), 0, config.type_vocab_size, types)
    _require_range("global_token_type_ids", given.get("global_token_type_ids"), 0, config.type_vocab_size, types)
    what = f"an index of one of the {num_globals} global tokens, or -1 for none"
    for name in ("sentence_ids", "mention_ids"):
        links = given.get(name)
        _require_range(name, links, -1, num_globals, what)
        if links is not None and num_globals > 0:
            # A real long token linked to a padding global token: the link points to no token.
            target_is_padding = ~global_mask.gather(1, links.clamp(min=0)) & (links >= 0) & long_mask
            if bool(target_is_padding.any()):
                example, position = (int(i) for i in target_is_padding.nonzero()[0])
                raise ValueError(
                    f"{name}[{example}, {position}] = {int(links[example, position])} points to a padding global "
                    f"token (global_attention_mask is 0 there)"
                )
