"""NQModel: the global-local encoder with ETC's Natural Questions heads (Ainslie et al., 2020,
arXiv:2004.08483, section 4; google-research/google-research etcmodel/models/nq/run_nq_lib.py).

- long answer: start and end softmaxes over the long tokens ([CLS] and the document's tokens);
- short answer: start and end softmaxes over the same tokens;
- answer type NULL / YES / NO / LONG / SHORT from global token 0 (CLS).
A window without an answer has every span target at [CLS] (long token 0), as in BERT-joint
(Alberti et al., 2019) and ETC (Ainslie et al., 2020, section 4): the logits there are the
window's "no answer" score. The loss is the mean of the three heads' cross-entropies (each span
head's loss is the mean of its start and end terms).
"""

from dataclasses import dataclass

from torch import Tensor
from transformers.utils import ModelOutput

from longdoc.model.heads import GlobalTokenClassifier, SpanHead, classification_loss, mean_loss, span_loss
from longdoc.model.task_model import TaskModel
from longdoc.data.options import stored_defaults
from longdoc.tasks.nq import NQOptions
from longdoc.tasks.nq.features import ANSWER_TYPES, ROW_SPECS


@dataclass
class NQOutput(ModelOutput):
    """loss (scalar, with labels); type_logits [B, 5]; long_start_logits, long_end_logits,
    short_start_logits, short_end_logits [B, L] (masked to [CLS] and document tokens)."""

    loss: Tensor | None = None
    type_logits: Tensor | None = None
    long_start_logits: Tensor | None = None
    long_end_logits: Tensor | None = None
    short_start_logits: Tensor | None = None
    short_end_logits: Tensor | None = None


class NQModel(TaskModel):
    task_name = "nq"
    # Those of NQOptions a model keeps (not how a training file is read): prediction reads them from config.json.
    default_task_options = stored_defaults(NQOptions)
    prediction_inputs = tuple(spec for spec in ROW_SPECS if spec.name == "answer_mask")

    def __init__(self, config):
        super().__init__(config)
        hidden = config.hidden_size
        self.long_head = SpanHead(hidden)
        self.short_head = SpanHead(hidden)
        self.type_head = GlobalTokenClassifier(hidden, len(ANSWER_TYPES))
        self.post_init()

    def forward(
        self,
        answer_mask: Tensor | None = None,
        answer_type: Tensor | None = None,
        long_start_positions: Tensor | None = None,
        long_end_positions: Tensor | None = None,
        short_start_positions: Tensor | None = None,
        short_end_positions: Tensor | None = None,
        **inputs: Tensor,
    ) -> NQOutput:
        """The three heads' logits for a batch of windows, and with labels the loss (the mean of the heads').

        The mask comes from `features.collate`; the labels are as in longdoc.tasks.nq.features: a
        target the window's answer does not have points at [CLS] (long token 0).

        Args:
            answer_mask [B, L] bool: where a span may start or end ([CLS] and document tokens);
                None: every long token.
            answer_type [B] int64: null, yes, no, long or short (`ANSWER_TYPES`, 0 to 4); None: no
                loss is computed.
            long_start_positions [B] int64: the long answer's first long token.
            long_end_positions [B] int64: the long answer's last long token.
            short_start_positions [B] int64: the first short answer's first long token.
            short_end_positions [B] int64: the last short answer's last long token.
            **inputs: the encoder's inputs (`GlobalLocalModel.forward`).

        Returns:
            NQOutput: `type_logits` [B, 5], `long_start_logits`, `long_end_logits`,
            `short_start_logits` and `short_end_logits` [B, L] (masked to [CLS] and document
            tokens), and the scalar `loss` when `answer_type` is given.
        """
        encoded = self.encode(inputs)
        long_start, long_end = self.long_head(encoded.long_hidden_state, answer_mask)
        short_start, short_end = self.short_head(encoded.long_hidden_state, answer_mask)
        type_logits = self.type_head(encoded.global_hidden_state, 0)
        loss = None
        if answer_type is not None:
            loss = mean_loss(
                span_loss(long_start, long_end, long_start_positions, long_end_positions),
                span_loss(short_start, short_end, short_start_positions, short_end_positions),
                classification_loss(type_logits, answer_type),
            )
        return NQOutput(loss=loss, type_logits=type_logits, long_start_logits=long_start, long_end_logits=long_end,
                        short_start_logits=short_start, short_end_logits=short_end)
