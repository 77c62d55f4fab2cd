"""The model of continued pretraining: a global-local encoder plus a masked-LM head and a CPC projection.

References: ETC (Ainslie et al., 2020, arXiv:2004.08483, section 3.3 and appendix) pretrains with
masked language modelling and Contrastive Predictive Coding over the sentence global tokens, one
global token per sentence with hard g2l; CPC and its InfoNCE loss are from van den Oord et al.
(2018, arXiv:1807.03748); RealFormer (He et al., 2020) keeps residual attention on during
pretraining, as the encoder's config does by default. Its batches come from
`longdoc.data.pretraining_corpus.PretrainingCollator`; the job is `longdoc.train.pretraining`.

`GlobalLocalForPretraining`: encoder + MLM head (transform, decoder tied to the word embeddings)
+ CPC projection; `forward(**batch)` returns the total loss, mlm_loss + cpc_loss, and each part.

CPC as chosen here. ETC trains "the hidden representation of the global sentence summary tokens
for the masked sentences" to be close to "that of a global summary token that can see the unmasked
sentence and nothing else", with an NCE loss. We take that literally: the target encoding of a
masked sentence is the output of a sentence global token in a second pass of the same encoder
over that sentence alone (its unmasked tokens plus its one global token: under hard g2l it sees
exactly the sentence). The prediction is the masked sentence's global output in the main pass
through a learnt linear projection (CPC's W_k, starting at the identity); the score of a
(prediction, target) pair is their cosine similarity over a temperature of 0.1; the negatives are
the other CPC sentences of the batch (in-batch, InfoNCE). Gradients flow into both passes: the
second pass teaches the global token to summarise its sentence, which is what fine-tuning's
sentence globals need. A mean of long outputs was not
chosen because it trains no global token; a fixed projection of the embeddings would not train
the summary at all.
"""

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.utils import ModelOutput

from longdoc.errors import InputError, OptionError
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.encoder_folder import readable_weights
from longdoc.model.pretrained import EncoderWithHeads
from longdoc.model.inputs import encoder_inputs

# The pretraining heads live beside the encoder's own files, so a later run started from the
# output (`--init`) continues with trained heads; GlobalLocalModel.from_pretrained ignores the file.
HEADS_FILE = "pretraining_heads.safetensors"
# CPC scores are cosine similarities divided by this temperature (SimCLR, Chen et al. 2020,
# arXiv:2002.05709, uses 0.1-0.5): bounded logits whatever the scale of the hidden states.
CPC_TEMPERATURE = 0.1
# BERT's names for its MLM transform and output bias (BertForPreTraining / BertForMaskedLM).
_BERT_MLM_NAMES = {
    "mlm_transform.dense.weight": "cls.predictions.transform.dense.weight",
    "mlm_transform.dense.bias": "cls.predictions.transform.dense.bias",
    "mlm_transform.layer_norm.weight": "cls.predictions.transform.LayerNorm.weight",
    "mlm_transform.layer_norm.bias": "cls.predictions.transform.LayerNorm.bias",
    "mlm_bias": "cls.predictions.bias",
}


@dataclass
class PretrainingOutput(ModelOutput):
    """loss = mlm_loss + cpc_loss (0-dim; mlm_loss alone in a batch with fewer than 2 CPC sentences,
    which has no CPC task: cpc_loss and cpc_accuracy are then None); accuracies and counts for
    logging (0-dim, no gradient)."""

    loss: Tensor | None = None
    mlm_loss: Tensor | None = None
    cpc_loss: Tensor | None = None
    mlm_accuracy: Tensor | None = None
    cpc_accuracy: Tensor | None = None
    mlm_tokens: Tensor | None = None
    cpc_sentences: Tensor | None = None


class MaskedLMTransform(nn.Module):
    """BERT's prediction transform: dense, activation, LayerNorm (before the tied decoder)."""

    def __init__(self, config: GlobalLocalConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACT2FN[config.hidden_act]
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.layer_norm(self.activation(self.dense(hidden)))


class GlobalLocalForPretraining(EncoderWithHeads):
    """`self.encoder` (a GlobalLocalModel) + MLM head (decoder tied to the word embeddings) + CPC projection."""

    def __init__(self, config: GlobalLocalConfig):
        super().__init__(config)
        self.mlm_transform = MaskedLMTransform(config)
        self.mlm_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.cpc_projection = nn.Linear(config.hidden_size, config.hidden_size)
        # Sums of the loss parts over training batches since the last evaluation (not weights), for
        # the evaluation callback's train_* metrics.
        self.training_sums: Counter = Counter()
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if module is getattr(self, "cpc_projection", None):
            # Identity: the first CPC scores compare the encoder's own global outputs; a random
            # 0.02-scale projection left them near zero, and a run of MiniLM at lr 1e-4 stayed at
            # chance for 60 steps.
            init.eye_(module.weight)
            init.zeros_(module.bias)

    def head_state_dict(self) -> dict[str, Tensor]:
        return {name: value for name, value in self.state_dict().items() if not name.startswith("encoder.")}

    def forward(self, mlm_labels: Tensor, cpc_positions: Tensor, **batch: Tensor) -> PretrainingOutput:
        """mlm_labels [B, L] (-100: no target); cpc_positions [N, 2] (example, sentence) of the CPC
        sentences; cpc_* [N, S] the second-pass inputs; the rest are encoder inputs."""
        output = self.encoder(**encoder_inputs(batch))
        targets = mlm_labels != -100
        hidden = output.long_hidden_state[targets]
        logits = F.linear(self.mlm_transform(hidden), self.encoder.embeddings.word_embeddings.weight, self.mlm_bias)
        labels = mlm_labels[targets]
        mlm_loss = F.cross_entropy(logits, labels) if len(labels) else logits.sum() * 0.0
        with torch.no_grad():
            mlm_accuracy = (logits.argmax(-1) == labels).float().mean() if len(labels) else logits.new_zeros(())

        count = len(cpc_positions)
        if count >= 2:
            predicted = self.cpc_projection(output.global_hidden_state[cpc_positions[:, 0], cpc_positions[:, 1]])
            sentences = self.encoder(**encoder_inputs({name[len("cpc_"):]: value for name, value in batch.items()
                                                       if name.startswith("cpc_")}))
            target = sentences.global_hidden_state[:, 0]
            # [N, N] cosine similarities over a temperature; the diagonal holds the right pairs.
            scores = F.normalize(predicted, dim=-1) @ F.normalize(target, dim=-1).T / CPC_TEMPERATURE
            answer = torch.arange(count, device=scores.device)
            cpc_loss = F.cross_entropy(scores, answer)
            with torch.no_grad():
                cpc_accuracy = (scores.argmax(-1) == answer).float().mean()
        else:
            # One CPC sentence has no negatives to be told apart from: no CPC task in this batch.
            cpc_loss = cpc_accuracy = None
        if self.training:
            self.training_sums.update(batches=1, mlm_loss=mlm_loss.item())
            if cpc_loss is not None:
                self.training_sums.update(cpc_batches=1, cpc_loss=cpc_loss.item())
        return PretrainingOutput(
            loss=mlm_loss if cpc_loss is None else mlm_loss + cpc_loss, mlm_loss=mlm_loss.detach(),
            cpc_loss=None if cpc_loss is None else cpc_loss.detach(), mlm_accuracy=mlm_accuracy,
            cpc_accuracy=cpc_accuracy,
            mlm_tokens=torch.tensor(len(labels)), cpc_sentences=torch.tensor(count),
        )

    @classmethod
    def from_encoder(cls, directory: str | Path, encoder_config: dict | None = None,
                     mlm_head_from: str | Path | None = None) -> "GlobalLocalForPretraining":
        """The encoder in `directory` with pretraining heads: restored from its HEADS_FILE (a
        previous pretraining run's output), else the MLM transform and bias from `mlm_head_from`
        (a BERT-family folder holding `cls.predictions.*`, e.g. the checkpoint that was lifted),
        else fresh (drawn from the current torch seed)."""
        from safetensors.torch import load_file

        model = super().from_encoder(directory, encoder_config)
        heads = Path(directory) / HEADS_FILE
        if heads.is_file():
            with readable_weights(heads):
                head_weights = load_file(heads)
            missing = set(model.head_state_dict()) - set(head_weights)
            if missing:
                raise InputError(f"{heads}: lacks {', '.join(sorted(missing))}")
            model.load_state_dict(head_weights, strict=False)
        elif mlm_head_from is not None:
            model.load_bert_mlm_head(mlm_head_from)
        return model

    def load_bert_mlm_head(self, directory: str | Path) -> None:
        """Copy BERT's MLM transform and output bias (`cls.predictions.*`) from a BERT-family folder."""
        from safetensors import safe_open

        path = Path(directory) / "model.safetensors"
        if not path.is_file():
            raise OptionError("{mlm_head_from} {directory}: no model.safetensors", directory=directory)
        with readable_weights(path), safe_open(str(path), "pt") as weights:
            available = set(weights.keys())
            missing = [source for source in _BERT_MLM_NAMES.values() if source not in available]
            if missing:
                raise OptionError("{mlm_head_from} {directory}: no MLM head weights ({missing} missing)",
                                  directory=directory, missing=", ".join(missing))
            state = {target: weights.get_tensor(source) for target, source in _BERT_MLM_NAMES.items()}
        current = self.state_dict()
        for name, value in state.items():
            if value.shape != current[name].shape:
                raise OptionError("{mlm_head_from} {directory}: {name} has shape {shape}, the encoder needs {needed}",
                                  directory=directory, name=_BERT_MLM_NAMES[name], shape=tuple(value.shape),
                                  needed=tuple(current[name].shape))
        self.load_state_dict(state, strict=False)

    def split_state_dict(self, state_dict: dict[str, Tensor] | None = None) -> tuple[dict, dict]:
        """(the bare encoder's weights under GlobalLocalModel's names, the heads' weights, for HEADS_FILE)
        of `state_dict` (this model's, e.g. gathered from shards) or of the current weights."""
        state_dict = self.state_dict() if state_dict is None else state_dict
        prefix = "encoder."
        encoder_state = {name[len(prefix):]: value for name, value in state_dict.items() if name.startswith(prefix)}
        heads = {name: value for name, value in state_dict.items() if not name.startswith(prefix)}
        return encoder_state, heads
