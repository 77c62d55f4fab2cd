"""WikiHopModel: the global-local encoder with ETC's WikiHop head (Ainslie et al., 2020,
arXiv:2004.08483, section 4; google-research/google-research etcmodel/models/wikihop/run_wikihop_lib.py):
one score per candidate global token, a softmax over the candidates, cross-entropy on the answer's
candidate.

The score reads the candidate token's final state plus the mean state of the long tokens linked
to it (its name in the candidate list and its mentions, `mention_ids`). Why: every candidate
token has the same input id and sees every long token, so with relative-position tables that
start fresh (a lifted checkpoint has none) the candidate states start out nearly equal and the
softmax near uniform; the linked tokens' states differ from the first step (their words differ).
"""

from dataclasses import dataclass

from torch import Tensor
from transformers.utils import ModelOutput

from longdoc.data.windows import QuestionLengthOption
from longdoc.model.heads import GlobalTokenScorer, classification_loss, pool_linked
from longdoc.model.task_model import TaskModel
from longdoc.data.options import stored_defaults
from longdoc.tasks.wikihop.features import EXTRA_INPUTS


@dataclass
class WikiHopOutput(ModelOutput):
    """loss (scalar, with labels); candidate_logits [B, G] (masked to candidate globals)."""

    loss: Tensor | None = None
    candidate_logits: Tensor | None = None


class WikiHopModel(TaskModel):
    task_name = "wikihop"
    default_task_options = stored_defaults(QuestionLengthOption)
    prediction_inputs = tuple(spec for spec in EXTRA_INPUTS if spec.name == "candidate_mask")

    def __init__(self, config):
        super().__init__(config)
        self.candidate_head = GlobalTokenScorer(config.hidden_size)
        self.post_init()

    def forward(
        self, candidate_mask: Tensor | None = None, label: Tensor | None = None, **inputs: Tensor
    ) -> WikiHopOutput:
        """`inputs`: the encoder's (GlobalLocalModel.forward); candidate_mask [B, G]; label [B]: the
        global index of the answer's candidate token (-1: none), from `features.collate`."""
        encoded = self.encode(inputs)
        global_hidden = encoded.global_hidden_state
        linked = pool_linked(encoded.long_hidden_state, inputs["mention_ids"], global_hidden.shape[1])
        logits = self.candidate_head(global_hidden + linked, candidate_mask)
        loss = classification_loss(logits, label) if label is not None else None
        return WikiHopOutput(loss=loss, candidate_logits=logits)
