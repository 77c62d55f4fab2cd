"""HotpotQAModel: the global-local encoder with ETC's three HotpotQA heads (Ainslie et al., 2020,
arXiv:2004.08483, section 4; google-research/google-research etcmodel/models/hotpotqa/run_finetuning_lib.py).

- supporting facts: one logit per sentence global token, sigmoid cross-entropy;
- answer type (span / yes / no) from global token 0 (CLS), cross-entropy; with the task option
  `type_from_question` from CLS and the mean of the question's global tokens. Trained jointly
  with the span loss on generated multihop data at 512 wordpieces, CLS alone never chose yes/no
  (0 of 18 held-out comparisons after 800 examples: the span loss shapes the encoder, and CLS did
  not come to tell the question kinds apart); with the question mean all 22 held-out comparisons
  were recognised after 100. Off by default, ETC's construction (the demo's span-only run, one
  CPU thread: answer F1 0.683 off / 0.425 on with training seed 0, 0.775 / 0.758 with seed 1);
- answer span: start and end softmaxes over the context sentences' long tokens, cross-entropy.
The loss is the mean of the three (ETC, Ainslie et al., 2020, section 4; a term without labels
in the batch, such as spans in a batch of yes/no windows, is left out of the mean).
"""

from dataclasses import dataclass

from torch import Tensor
from transformers.utils import ModelOutput

from longdoc.model.heads import (
    GlobalTokenClassifier, GlobalTokenScorer, SpanHead, binary_loss, classification_loss, mean_loss, span_loss,
)
from longdoc.model.task_model import TaskModel
from longdoc.data.options import stored_defaults
from longdoc.tasks.hotpotqa import HotpotQAOptions
from longdoc.tasks.hotpotqa.features import ANSWER_TYPES, EXTRA_INPUTS


@dataclass
class HotpotQAOutput(ModelOutput):
    """loss (scalar, with labels); type_logits [B, 3]; start_logits, end_logits [B, L] (masked to
    context sentences); sp_logits [B, G] (masked to sentence globals)."""

    loss: Tensor | None = None
    type_logits: Tensor | None = None
    start_logits: Tensor | None = None
    end_logits: Tensor | None = None
    sp_logits: Tensor | None = None


class HotpotQAModel(TaskModel):
    task_name = "hotpotqa"
    default_task_options = stored_defaults(HotpotQAOptions)
    prediction_inputs = tuple(spec for spec in EXTRA_INPUTS
                              if spec.name in ("answer_mask", "sentence_mask", "question_mask"))

    def __init__(self, config):
        super().__init__(config)
        hidden = config.hidden_size
        self.span_head = SpanHead(hidden)
        self.type_head = GlobalTokenClassifier(hidden, len(ANSWER_TYPES),
                                               pool_selected=self.task_options["type_from_question"])
        self.sp_head = GlobalTokenScorer(hidden)
        self.post_init()

    def forward(
        self,
        answer_mask: Tensor | None = None,
        sentence_mask: Tensor | None = None,
        question_mask: Tensor | None = None,
        sp_labels: Tensor | None = None,
        answer_type: Tensor | None = None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
        **inputs: Tensor,
    ) -> HotpotQAOutput:
        """The three heads' logits for a batch of windows, and with labels the loss (the mean of the heads').

        The masks come from `features.collate`; the labels are as in longdoc.tasks.hotpotqa.features,
        -1 (IGNORE_INDEX) where a row or token has none.

        Args:
            answer_mask [B, L] int64: 1 on long tokens of context sentences, where a span may start
                and end; None: every long token.
            sentence_mask [B, G] int64: 1 on sentence global tokens, the ones that get a
                supporting-fact logit; None: every global token.
            question_mask [B, G] int64: 1 on question global tokens, which the answer-type head
                averages with the task option `type_from_question`.
            sp_labels [B, G] int64: 1 / 0 for a sentence that is / is not a supporting fact, -1
                elsewhere.
            answer_type [B] int64: 0 span, 1 yes, 2 no (`ANSWER_TYPES`); None: no loss is computed.
            start_positions [B] int64: the first long token of the gold answer in the window, -1
                when it does not lie whole in it.
            end_positions [B] int64: the last long token of that answer, -1 likewise.
            **inputs: the encoder's inputs (`GlobalLocalModel.forward`).

        Returns:
            HotpotQAOutput: `type_logits` [B, 3], `start_logits` and `end_logits` [B, L] (masked to
            context sentences), `sp_logits` [B, G] (masked to sentence globals), and the scalar
            `loss` when `answer_type` is given.
        """
        encoded = self.encode(inputs)
        start_logits, end_logits = self.span_head(encoded.long_hidden_state, answer_mask)
        type_logits = self.type_head(encoded.global_hidden_state, 0, question_mask)
        sp_logits = self.sp_head(encoded.global_hidden_state, sentence_mask)
        loss = None
        if answer_type is not None:
            loss = mean_loss(
                binary_loss(sp_logits, sp_labels),
                classification_loss(type_logits, answer_type),
                span_loss(start_logits, end_logits, start_positions, end_positions),
            )
        return HotpotQAOutput(loss=loss, type_logits=type_logits, start_logits=start_logits, end_logits=end_logits,
                              sp_logits=sp_logits)
