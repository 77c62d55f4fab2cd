"""OpenKPModel: the global-local encoder with ETC's OpenKP keyphrase head (Ainslie et al., 2020,
arXiv:2004.08483, section 4; google-research/google-research etcmodel/models/openkp/run_finetuning_lib.py).

The long tokens' outputs are averaged per word (the wordpieces of one page token); for
n = 1..5 a width-n convolution over the word vectors gives a logit per (n, start word)
(`longdoc.model.heads.NgramScorer`); one softmax runs over all (n, start) pairs of a window.
The loss is the cross-entropy between that softmax and the gold n-grams of the window, spread
evenly over them (a window with three keyphrase occurrences wants a third of the mass on each);
windows without a gold n-gram add nothing. ETC: Ainslie et al., 2020, section 4.

The encoder always carries the 20 visual features of the DOM-node global tokens
(`global_feature_size` = 20): `from_encoder` sets it, so a lifted text encoder gets a fresh
feature projection.
"""

from dataclasses import dataclass

from torch import Tensor
from transformers.utils import ModelOutput

from longdoc.data.windows import StrideOption
from longdoc.model.heads import NgramScorer, pool_linked
from longdoc.model.task_model import TaskModel
from longdoc.data.options import stored_defaults
from longdoc.tasks.openkp.features import MAX_NGRAM, ROW_SPECS
from longdoc.tasks.openkp.reader import VISUAL_FEATURE_SIZE


@dataclass
class OpenKPOutput(ModelOutput):
    """loss (scalar, with labels); ngram_logits [B, MAX_NGRAM, W]: entry (n - 1, i) scores words
    i .. i + n - 1 of the window (masked past its last word)."""

    loss: Tensor | None = None
    ngram_logits: Tensor | None = None


def ngram_loss(logits: Tensor, labels: Tensor) -> Tensor | None:
    """Cross-entropy of one softmax over all (n, start) pairs per row against the row's gold pairs,
    spread evenly; rows without a gold pair are left out (None when no row has one)."""
    flat_logits, flat_labels = logits.flatten(1).float(), labels.flatten(1).float()
    counts = flat_labels.sum(-1)
    keep = counts > 0
    if not bool(keep.any()):
        return None
    targets = flat_labels[keep] / counts[keep].unsqueeze(-1)
    return -(targets * flat_logits[keep].log_softmax(-1)).sum(-1).mean()


class OpenKPModel(TaskModel):
    task_name = "openkp"
    default_task_options = stored_defaults(StrideOption)
    prediction_inputs = tuple(spec for spec in ROW_SPECS if spec.name in ("word_ids", "word_mask"))

    def __init__(self, config):
        if config.global_feature_size != VISUAL_FEATURE_SIZE:
            raise ValueError(f"an OpenKP model needs global_feature_size = {VISUAL_FEATURE_SIZE} (the visual features "
                             f"of DOM nodes), got {config.global_feature_size}")
        super().__init__(config)
        self.ngram_head = NgramScorer(config.hidden_size, MAX_NGRAM)
        self.post_init()

    @classmethod
    def from_encoder(cls, directory, encoder_config=None, **task_options) -> "OpenKPModel":
        encoder_config = {**(encoder_config or {}), "global_feature_size": VISUAL_FEATURE_SIZE}
        return super().from_encoder(directory, encoder_config, **task_options)

    def forward(self, word_ids: Tensor, word_mask: Tensor, ngram_labels: Tensor | None = None,
                **inputs: Tensor) -> OpenKPOutput:
        """`inputs`: the encoder's (GlobalLocalModel.forward); word_ids [B, L], word_mask [B, W] and
        ngram_labels [B, MAX_NGRAM, W] as in longdoc.tasks.openkp.features."""
        encoded = self.encode(inputs)
        words = pool_linked(encoded.long_hidden_state, word_ids, word_mask.shape[1])
        logits = self.ngram_head(words, word_mask)
        loss = None if ngram_labels is None else ngram_loss(logits, ngram_labels)
        return OpenKPOutput(loss=loss, ngram_logits=logits)
