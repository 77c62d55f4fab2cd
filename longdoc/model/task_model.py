"""TaskModel: the base of every task model, a `GlobalLocalModel` encoder plus task heads.

In the transformers style (BertForQuestionAnswering: `self.bert` plus a head): a TaskModel is a
`PreTrainedModel` whose `config.json` is the encoder's `GlobalLocalConfig` plus two fields,
`task` (the task's registry name) and `task_options` (head and decoding settings, e.g. the
supporting-fact threshold), and whose weights are one safetensors file: the encoder's under
`encoder.`, the heads' beside them. So `Class.from_pretrained(DIR)` restores a trained model in one
line, with its settings.

A subclass sets `task_name`, `default_task_options`, `prediction_inputs` (the specs of the inputs
besides the encoder's that its forward reads at prediction time: what an exported graph takes) and
builds its heads (`longdoc.model.heads`) in `__init__(config)`, reading `self.task_options`; its
`forward(**batch)` names the labels and masks it takes, calls `self.encode(inputs)` with the rest (the encoder's inputs; any other key is
an error) and the heads, never the encoder's insides, and returns a typed output with `.loss` when
labels are given.

Starting points:
- `Class.from_encoder(DIR, encoder_config=..., **task_options)`: the weights of a lifted encoder
  (`longdoc lift`, or the default lifted MiniLM) in `.encoder`, fresh heads
  (`longdoc.model.pretrained.EncoderWithHeads.from_encoder`). `encoder_config`
  overrides encoder settings that need no new weights or that start fresh (lengths,
  `residual_attention`, `talking_heads` starting at identity).
- `Class.from_pretrained(DIR)`: a trained model of this task. A bare encoder or a model of another
  task is refused with a `ModelFolderError` saying what DIR holds (the command line adds how to
  get the right model). The tokenizer saved beside it: `longdoc.model_folder.read_tokenizer(DIR)`.

`model.forward_rows(rows, collate, batch_size)` runs a trained model over feature rows batched by
length, with a progress bar: what every task's `decode.predict` needs. `run_rows` is that loop for
any callable from a batch to outputs (an exported model's runtime, longdoc.export.runtime, too).
"""

import inspect
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from longdoc.errors import DeviceMemoryError, InputError, ModelFolderError
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.encoder_folder import describe_checkpoint, readable_weights
from longdoc.model.heads import SpanHead
from longdoc.model.inputs import (
    INPUT_ALIASES, MODEL_INPUT_NAMES, InputSpec, batch_shape, check_encoder_inputs, checked_batches,
)
from longdoc.model.modeling import GlobalLocalModelOutput
from longdoc.model.plain_reader import SPAN_READER_TASK
from longdoc.model.pretrained import EncoderWithHeads


# What lowers the memory a prediction batch takes (DeviceMemoryError; options named by field).
PREDICTION_REMEDIES = "lower {batch_size}, or compute in bfloat16 ({bf16})"


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices of `lengths` in batches of at most `batch_size`, longest first.

    Sorting by length keeps rows of similar length together, so padding to the longest row of a
    batch wastes little; longest first makes the first batch the largest one, so running out of
    memory shows at the first step instead of hours in. Ties keep their input order (stable sort).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


def _to_cpu(output: Tensor) -> Tensor:
    return output.to("cpu", torch.float32) if output.is_floating_point() else output.cpu()


class TaskModel(EncoderWithHeads):
    """An encoder (`self.encoder`, a GlobalLocalModel) plus the heads a subclass adds."""

    encoder_sources = (SPAN_READER_TASK,)

    task_name: ClassVar[str] = ""
    # Head and decoding settings and their defaults; what from_encoder is given overrides them.
    default_task_options: ClassVar[dict[str, Any]] = {}
    # The inputs besides the encoder's that forward reads at prediction time (never labels), as the
    # task's collate batches them: the masks its heads need.
    prediction_inputs: ClassVar[tuple[InputSpec, ...]] = ()

    def __init__(self, config: GlobalLocalConfig):
        super().__init__(config)
        config.task = self.task_name
        config.task_options = {**self.default_task_options, **getattr(config, "task_options", {})}
        unknown = set(config.task_options) - set(self.default_task_options)
        if unknown:
            raise InputError(
                f"{self.task_name} model: unknown option(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(sorted(self.default_task_options))}"
            )

    @property
    def task_options(self) -> dict[str, Any]:
        return self.config.task_options

    def encode(self, inputs: dict[str, Tensor]) -> GlobalLocalModelOutput:
        """The encoder on `inputs`: what `forward` was given besides the arguments it names. A key that
        is not an encoder input is a TypeError naming it (a misspelled label would otherwise be dropped
        and its loss never computed), as a call of `forward` with an unknown keyword would be; transformers'
        names (`input_ids`, ...: longdoc.model.inputs.INPUT_ALIASES) are the long input's."""
        unknown = sorted(set(inputs) - set(MODEL_INPUT_NAMES) - set(INPUT_ALIASES))
        if unknown:
            named = [name for name, parameter in inspect.signature(self.forward).parameters.items()
                     if parameter.kind is not parameter.VAR_KEYWORD]
            raise TypeError(f"{type(self).__name__}.forward got unknown input(s) {', '.join(unknown)}; "
                            f"known: {', '.join([*named, *MODEL_INPUT_NAMES, *INPUT_ALIASES])}")
        # (the aliases pass through: the encoder's forward resolves them, once)
        return self.encoder(**{name: value for name, value in inputs.items() if value is not None})

    @torch.no_grad()
    def forward_rows(
        self, rows: Sequence[dict[str, Any]], collate: Callable, batch_size: int, progress: bool = True,
        desc: str = "predicting",
    ) -> list[dict[str, Tensor]]:
        """The model's outputs for each feature row (in eval mode, no labels needed), in the rows' order
        (`run_rows`, with each batch moved to the model's device). A batch the device has no memory for
        is a DeviceMemoryError naming its shape."""
        self.eval()

        def forward(batch: dict[str, Tensor]):
            try:
                return self(**{name: value.to(self.device) for name, value in batch.items()})
            except torch.OutOfMemoryError:
                raise DeviceMemoryError("predicting", *batch_shape(batch), PREDICTION_REMEDIES) from None

        return run_rows(forward, self.config, rows, collate, batch_size, progress, desc)

    @classmethod
    def from_encoder(
        cls, directory: str | Path, encoder_config: dict[str, Any] | None = None, **task_options
    ) -> "TaskModel":
        """A new model of this task: the lifted encoder in `directory`, fresh heads (drawn from the
        current torch seed), `task_options` over the defaults, `encoder_config` over the encoder's config.
        A lifted span reader (longdoc.model.span_reader) gives its encoder, and its span head to a task
        that has one."""
        model = super().from_encoder(directory, encoder_config, task_options=task_options,
                                     architectures=[cls.__name__])
        head = getattr(model, "span_head", None)
        if isinstance(head, SpanHead):
            _start_span_head(head, directory)
        return model

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, config: GlobalLocalConfig | None = None,
                        **kwargs) -> "TaskModel":
        """A trained model of this task from a folder (see the module docstring for what is refused).
        `config`: the folder's config as already read (longdoc.model_folder.ModelFolder.model_config),
        so that config.json is not read again; None: read from the folder."""
        if config is None:
            check_task_checkpoint(pretrained_model_name_or_path, cls.task_name)
        else:
            check_task(pretrained_model_name_or_path, getattr(config, "task", None), cls.task_name)
        with readable_weights(pretrained_model_name_or_path):
            return super().from_pretrained(pretrained_model_name_or_path, *args, config=config, **kwargs)


def _start_span_head(head: SpanHead, directory: str | Path) -> None:
    """`head` starts as the span head of the lifted span reader in `directory` (its weights under
    `span_head.`); an encoder folder has none, and `head` stays fresh."""
    from safetensors import safe_open

    with readable_weights(directory), safe_open(str(Path(directory) / "model.safetensors"), "pt") as weights:
        found = {key.removeprefix("span_head."): weights.get_tensor(key) for key in weights.keys()
                 if key.startswith("span_head.")}
    if found:
        head.load_state_dict(found)


def check_task_checkpoint(directory: str | Path, task_name: str) -> dict[str, Any]:
    """config.json of `directory` if it holds a trained `task_name` model; else a ModelFolderError
    saying what it holds."""
    found = describe_checkpoint(directory, task_name)
    check_task(directory, found.get("task"), task_name)
    return found


def check_task(directory: str | Path, found: str | None, task_name: str) -> None:
    """A ModelFolderError saying what `directory` holds unless the task its config names, `found`, is
    `task_name`."""
    if not found:
        raise ModelFolderError(
            f"{directory}: is a bare encoder (GlobalLocalModel, no task head), not a trained {task_name} model",
            directory, "", task_name)
    if found != task_name:
        raise ModelFolderError(f"{directory}: is a trained {found} model, not a {task_name} model",
                               directory, found, task_name)


def run_rows(
    run: Callable[[dict[str, Tensor]], Any], config: GlobalLocalConfig, rows: Sequence[dict[str, Any]],
    collate: Callable, batch_size: int, progress: bool = True, desc: str = "predicting",
) -> list[dict[str, Tensor]]:
    """`run(batch)`'s outputs (a mapping by output name) for each feature row, in the rows' order.

    Rows are batched by length (`length_batches`, longest first), padded by `collate` and their
    values checked on the CPU, once (`check_encoder_inputs`; the forward then leaves them unchecked).

    Args:
        run: takes a collated batch and returns a mapping of outputs by name (a task model's
            forward on its device, say); its tensors with one entry per row of the batch are kept.
        config: the encoder's config: its `pad_token_id` pads the batches, and the checks of values
            read it.
        rows: feature rows, each a mapping of a task's features (`long_input_ids` among them).
        collate: called as `collate(rows, config.pad_token_id)`, gives a batch of tensors.
        batch_size: the most rows in a batch.
        progress: show a progress bar over the rows.
        desc: the progress bar's label.

    Returns:
        One dict per row: every batched tensor output at that row's index, on the CPU (results of a
        whole file add up: they stay out of GPU memory), floating ones as float32 whatever the
        model's dtype (decoders add and compare logits, which a lower precision would round), still
        padded to its batch's length (positions past the row's own length are padding).

    Raises:
        ValueError: an encoder input of a bad value, naming it (`check_encoder_inputs`).
    """
    results: list[dict[str, Tensor] | None] = [None] * len(rows)
    batches = length_batches([len(row["long_input_ids"]) for row in rows], batch_size)
    with tqdm(total=len(rows), desc=desc, unit=" windows", disable=not progress) as bar:
        for indices in batches:
            batch = collate([rows[i] for i in indices], config.pad_token_id)
            check_encoder_inputs(batch, config)  # the values, here on the CPU, not in forward on the device
            with checked_batches():
                output = run(batch)
            tensors = {name: _to_cpu(value) for name, value in output.items()
                       if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == len(indices)}
            for position, index in enumerate(indices):
                results[index] = {name: value[position] for name, value in tensors.items()}
            bar.update(len(indices))
    return results
