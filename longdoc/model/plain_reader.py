"""A lifted span reader for inference on torch alone: `load_span_reader(DIR, config)`.

`longdoc.model.span_reader.SpanReader` is a transformers model: loading it imports
`transformers.modeling_utils`, several times `import torch`'s time, which a command that only reads
passages (`longdoc ask --model READER`, `longdoc serve`) would pay on every start. `PlainSpanReader`
is the same modules under the same names (`encoder.` a `GlobalLocalEncoding`, `span_head.` a
`SpanHead`), so it loads the reader folder's state dict as it is and gives the same logits, bit for
bit; it reads the folder's config.json already read and its model.safetensors, nothing else.
Training, saving and the Auto classes stay SpanReader's.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from longdoc.errors import InputError
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.encoder_folder import WEIGHTS_FILE, readable_weights
from longdoc.model.heads import SpanHead
from longdoc.model.modeling import GlobalLocalEncoding, refuse_old_parameter_names, set_attention_backend

# The task name of a lifted extractive QA reader (longdoc.model.span_reader.SpanReader).
SPAN_READER_TASK = "span_reader"


@dataclass
class SpanLogits:
    """start_logits, end_logits [B, L] (masked to `answer_mask` where it is given): SpanReader's outputs."""

    start_logits: Tensor
    end_logits: Tensor


class PlainSpanReader(nn.Module):
    """SpanReader's modules and forward pass for inference, as a plain nn.Module."""

    def __init__(self, config: GlobalLocalConfig):
        super().__init__()
        self.config = config
        self.encoder = GlobalLocalEncoding(config)
        self.span_head = SpanHead(config.hidden_size)

    @property
    def task_options(self) -> dict:
        return self.config.task_options

    @property
    def device(self) -> torch.device:
        return self.span_head.projection.weight.device

    def set_attention_backend(self, name: str | None) -> None:
        """longdoc.model.modeling.set_attention_backend on this reader."""
        set_attention_backend(self, name)

    def forward(self, answer_mask: Tensor | None = None, **inputs: Tensor) -> SpanLogits:
        """`inputs`: the encoder's (GlobalLocalEncoding.forward); answer_mask [B, L]: positions an answer
        may start or end at (None: all)."""
        hidden = self.encoder(**{name: value for name, value in inputs.items() if value is not None})
        return SpanLogits(*self.span_head(hidden.long_hidden_state, answer_mask))


def load_span_reader(directory: str | Path, config: GlobalLocalConfig) -> PlainSpanReader:
    """The span reader in the folder `directory` whose config.json gave `config`, in eval mode, its
    weights read from model.safetensors (checked as every reader of weights checks them:
    encoder_folder.readable_weights). A weights file without every tensor of the reader, or with others,
    is an InputError naming what differs; weights under the attention's old names are refused with
    the command that renames them."""
    from safetensors.torch import load_file

    directory = Path(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise InputError(f"{directory}: no {WEIGHTS_FILE}; expected a longdoc model folder (config.json + "
                         f"{WEIGHTS_FILE})")
    # Built on the CPU, its drawn weights then replaced: built on the meta device, the weights' initialisation
    # goes through torch's reference decompositions, which import torch._dynamo (2 CPU s, more than drawing them).
    model = PlainSpanReader(config)
    with readable_weights(weights):  # (a damaged file: an InputError naming it, from its first read on)
        refuse_old_parameter_names(directory)
        state = load_file(weights)
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise InputError(f"{weights}: not a span reader's weights (missing: {', '.join(missing[:3]) or 'none'}; "
                         f"unexpected: {', '.join(unexpected[:3]) or 'none'})")
    model.load_state_dict(state, assign=True)
    return model.eval()
