"""The ETC-style global-local transformer: embeddings, layers and encoder.

One readable path from ids to hidden states: embeddings -> (pad the long input to whole blocks)
-> side inputs from structure ids and the attention backend (once) -> layers (attention,
feed-forward, norms; scores carried under residual attention) -> unpad. Attention itself lives in
longdoc/model/attention.py (its backends in longdoc/model/backends), masks and relative ids in
longdoc/model/side_inputs.py, argument checks in longdoc/model/inputs.py. The forward reads no
tensor on the host (the checks of values run on CPU inputs only, or where batches are collated),
so torch.compile traces it whole with the eager backend, and torch.export exports it.

The modules here run on torch alone (transformers' `ModelOutput` aside, from its light utilities):
`GlobalLocalEncoding` is the encoder as a plain nn.Module, built from a config and nothing else, what
inference loads without transformers' model machinery (longdoc.model.plain_reader.load_span_reader).
`GlobalLocalModel`, the same encoder as a transformers `PreTrainedModel` (from_pretrained,
save_pretrained, AutoModel, training's activation checkpointing), lives in longdoc.model.pretrained,
with the same modules under the same names (the same state dict): importing transformers' model
classes (`transformers.modeling_utils`) takes several times `import torch`'s time.
"""

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.utils import ModelOutput

from longdoc.errors import InputError
from longdoc.model.attention import OLD_PARAMETER_NAMES, AttentionCarry, AttentionWeights, GlobalLocalAttention
from longdoc.model.backends.base import AttentionBackend
from longdoc.model.backends.resolution import check_backend_name, resolve_backend
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.dropout import Dropout
from longdoc.model.inputs import check_and_collect, take_aliases
from longdoc.model.linear import Linear
from longdoc.model.side_inputs import SideInputs, build_side_inputs


# A checkpoint key outside the encoder's modules (see GlobalLocalModel._keys_to_ignore_on_load_unexpected).
HEAD_KEYS = r"^(?!(embeddings|encoder)\.)"


@dataclass
class GlobalLocalModelOutput(ModelOutput):
    """long_hidden_state [B, L, H] and global_hidden_state [B, G, H] (G = 0 without global tokens);
    attention_weights: each layer's, when asked for (`GlobalLocalModel.keep_attention_weights`)."""

    long_hidden_state: Tensor | None = None
    global_hidden_state: Tensor | None = None
    attention_weights: tuple[AttentionWeights, ...] | None = None


class GlobalLocalEmbeddings(nn.Module):
    """Word + token type (+ absolute position) embeddings, shared by the long and global inputs;
    global tokens may add a projected feature vector (OpenKP's visual features) and have a LayerNorm
    of their own (`separate_global_embedding_norm`)."""

    def __init__(self, config: GlobalLocalConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.position_embeddings = (
            nn.Embedding(config.max_position_embeddings, config.hidden_size) if config.uses_absolute_positions else None
        )
        self.global_absolute_positions = config.global_absolute_positions
        self.global_feature_projection = (
            nn.Linear(config.global_feature_size, config.hidden_size) if config.global_feature_size else None
        )
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.global_layer_norm = (nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
                                  if config.separate_global_embedding_norm else None)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None, features: Tensor | None = None,
                is_global: bool = False) -> Tensor:
        embeddings = self.word_embeddings(input_ids)
        if token_type_ids is None:
            embeddings = embeddings + self.token_type_embeddings.weight[0]
        else:
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        if self.position_embeddings is not None and (self.global_absolute_positions or not is_global):
            embeddings = embeddings + self.position_embeddings.weight[: input_ids.shape[1]]
        if features is not None:
            embeddings = embeddings + self.global_feature_projection(features.to(embeddings.dtype))
        norm = self.global_layer_norm if is_global and self.global_layer_norm is not None else self.layer_norm
        return self.dropout(norm(embeddings))


class FeedForward(nn.Module):
    def __init__(self, config: GlobalLocalConfig):
        super().__init__()
        self.intermediate = Linear(config.hidden_size, config.intermediate_size)
        self.activation = config.hidden_act
        self.output = Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.output(self.intermediate(hidden, activation=self.activation))


class CheckpointedLayer(nn.Module):
    """A layer whose forward transformers' activation checkpointing can wrap, as its
    GradientCheckpointingLayer does: `PreTrainedModel.activation_checkpointing_enable` sets
    `gradient_checkpointing` and `_gradient_checkpointing_func` on every module that has the first, and
    a layer so marked, in training with autograd on, is called through that function (which
    recomputes it in the backward). Here so that the layers build without transformers' model classes."""

    gradient_checkpointing = False

    def __call__(self, *args, **kwargs):
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return self._gradient_checkpointing_func(functools.partial(super().__call__, **kwargs), *args)
        return super().__call__(*args, **kwargs)


class GlobalLocalLayer(CheckpointedLayer):
    """Attention then feed-forward for both streams; post-LN (BERT, RealFormer) or pre-LN."""

    def __init__(self, config: GlobalLocalConfig):
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        self.pre_layer_norm = config.pre_layer_norm
        self.attention = GlobalLocalAttention(config)
        self.long_attention_norm = nn.LayerNorm(hidden, eps=eps)
        self.global_attention_norm = nn.LayerNorm(hidden, eps=eps)
        self.long_feed_forward = FeedForward(config)
        self.global_feed_forward = None if config.share_feed_forward else FeedForward(config)
        self.long_output_norm = nn.LayerNorm(hidden, eps=eps)
        self.global_output_norm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        long_hidden: Tensor,
        global_hidden: Tensor,
        side: SideInputs,
        carry: AttentionCarry | None,
        layer_number: int,
        backend: AttentionBackend,
    ) -> tuple[Tensor, Tensor, AttentionCarry, AttentionWeights | None]:
        """One layer over both streams: attention, then feed-forward, each with its residual and norm.

        Post-LN (BERT, RealFormer) normalises after each residual sum; pre-LN (`config.pre_layer_norm`)
        normalises each sublayer's input and leaves the residual stream unnormalised. Without
        `config.share_feed_forward` the global stream has a feed-forward of its own.

        Args:
            long_hidden [B, Lp, H] float: the long stream, padded to whole blocks (Lp =
                `side.padded_length`).
            global_hidden [B, G, H] float: the global stream (G = 0 without global tokens).
            side: the masks and relative ids of this forward pass (`build_side_inputs`), shared by
                every layer.
            carry: the scores the previous layer carried under residual attention; None in the
                first layer.
            layer_number: this layer's number, counted from 1 (residual attention with
                `residual_attention_mean` divides the summed scores by it).
            backend: the attention backend of this forward pass.

        Returns:
            (long_hidden [B, Lp, H], global_hidden [B, G, H], the scores to carry to the next layer,
            this layer's attention weights if `backend.keep_weights`, else None).
        """
        global_feed_forward = self.global_feed_forward or self.long_feed_forward
        if self.pre_layer_norm:
            long_attended, global_attended, carry, weights = self.attention(
                self.long_attention_norm(long_hidden), self.global_attention_norm(global_hidden),
                side, carry, layer_number, backend,
            )
            long_hidden = long_hidden + self.dropout(long_attended)
            global_hidden = global_hidden + self.dropout(global_attended)
            long_hidden = long_hidden + self.dropout(self.long_feed_forward(self.long_output_norm(long_hidden)))
            global_hidden = global_hidden + self.dropout(global_feed_forward(self.global_output_norm(global_hidden)))
        else:
            long_attended, global_attended, carry, weights = self.attention(
                long_hidden, global_hidden, side, carry, layer_number, backend
            )
            long_hidden = self.long_attention_norm(long_hidden + self.dropout(long_attended))
            global_hidden = self.global_attention_norm(global_hidden + self.dropout(global_attended))
            long_hidden = self.long_output_norm(long_hidden + self.dropout(self.long_feed_forward(long_hidden)))
            global_hidden = self.global_output_norm(global_hidden + self.dropout(global_feed_forward(global_hidden)))
        return long_hidden, global_hidden, carry, weights


class GlobalLocalEncoder(nn.Module):
    def __init__(self, config: GlobalLocalConfig):
        super().__init__()
        self.layers = nn.ModuleList(GlobalLocalLayer(config) for _ in range(config.num_hidden_layers))
        # Pre-LN leaves the residual stream unnormalised: one final norm per stream.
        self.final_long_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.pre_layer_norm else None
        self.final_global_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.pre_layer_norm else None

    def forward(
        self, long_hidden: Tensor, global_hidden: Tensor, side: SideInputs, backend: AttentionBackend
    ) -> tuple[Tensor, Tensor, tuple[AttentionWeights, ...] | None]:
        """The layers; `backend`: the attention backend of this forward pass. Returns the hidden states
        and, if `backend.keep_weights`, each layer's attention weights."""
        carry, weights = None, []
        for number, layer in enumerate(self.layers, start=1):
            long_hidden, global_hidden, carry, layer_weights = layer(long_hidden, global_hidden, side, carry, number,
                                                                     backend)
            weights.append(layer_weights)
        if self.final_long_norm is not None:
            long_hidden = self.final_long_norm(long_hidden)
            global_hidden = self.final_global_norm(global_hidden)
        return long_hidden, global_hidden, tuple(weights) if backend.keep_weights else None


def set_attention_backend(model: nn.Module, name: str | None) -> None:
    """Compute the attention of every encoder in `model` with backend `name` (one of
    longdoc.model.backends.BACKEND_NAMES: auto, eager, cpu, gpu, dense), overriding
    `config.attention_backend` without changing it (what `save_pretrained` writes); None: back to
    the config's. A backend that cannot run where the model runs is refused at the next forward
    pass (AttentionBackendError, one line saying what can)."""
    if name is not None:
        check_backend_name(name)
    for module in model.modules():
        if isinstance(module, EncoderForward):
            module.attention_backend = name


def keep_attention_weights(model: nn.Module, keep: bool = True) -> None:
    """Have every encoder in `model` return each layer's attention weights
    (`GlobalLocalModelOutput.attention_weights`), with the masks and, under residual attention, the
    carried and summed scores, for inspection (`longdoc analyze attention`): they cost memory (a [B,
    h, L, 3b + G] tensor per layer, three under residual attention) and nothing in a forward pass
    needs them."""
    for module in model.modules():
        if isinstance(module, EncoderForward):
            module.keeps_attention_weights = keep


class EncoderForward:
    """The encoder's modules and forward pass, shared by `GlobalLocalEncoding` (a plain nn.Module) and
    `GlobalLocalModel` (transformers' PreTrainedModel, longdoc.model.pretrained): `build(config)`
    makes the modules, under the names their state dicts have."""

    def build(self, config: GlobalLocalConfig) -> None:
        self.embeddings = GlobalLocalEmbeddings(config)
        self.encoder = GlobalLocalEncoder(config)
        # Run-time attention settings (set_attention_backend, keep_attention_weights): not saved.
        self.attention_backend: str | None = None
        self.keeps_attention_weights = False

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def forward(
        self,
        long_input_ids: Tensor | None = None,
        global_input_ids: Tensor | None = None,
        long_attention_mask: Tensor | None = None,
        global_attention_mask: Tensor | None = None,
        long_token_type_ids: Tensor | None = None,
        global_token_type_ids: Tensor | None = None,
        sentence_ids: Tensor | None = None,
        mention_ids: Tensor | None = None,
        long_paragraph_ids: Tensor | None = None,
        global_paragraph_ids: Tensor | None = None,
        global_sees_all: Tensor | None = None,
        global_features: Tensor | None = None,
        long_example_ids: Tensor | None = None,
        global_example_ids: Tensor | None = None,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> GlobalLocalModelOutput:
        """Encode a batch of rows: long and global token ids (and structure ids) -> hidden states.

        Structure ids build the attention masks and relative ids (`build_side_inputs`); an id of -1
        links a token to nothing. Names, shapes and dtypes are checked here; the values too when the
        inputs are on the CPU and nothing is tracing (`longdoc.model.inputs.check_and_collect`). The
        schema, with dtypes and padding values: `longdoc.model.inputs.ENCODER_INPUTS`.

        Args:
            long_input_ids [B, L] int64: the long input's token ids.
            global_input_ids [B, G] int64: the global tokens' ids; None: no global tokens (then no
                other global input may be given).
            long_attention_mask [B, L] int64: 1 for tokens, 0 for padding; None: all tokens.
            global_attention_mask [B, G] int64: 1 for tokens, 0 for padding; None: all tokens.
            long_token_type_ids [B, L] int64: token types of the long input; None: type 0.
            global_token_type_ids [B, G] int64: token types of the global tokens; None: type 0.
            sentence_ids [B, L] int64: the global token each long token belongs to (-1: none).
            mention_ids [B, L] int64: a second linked global token, e.g. the candidate a mention
                names (-1: none); needs `sentence_ids`.
            long_paragraph_ids [B, L] int64: the paragraph of each long token; None: no
                paragraph bounds local attention (`local_attention_within_paragraph` then does nothing).
            global_paragraph_ids [B, G] int64: the paragraph of each global token; None: global
                tokens get no "other paragraph" relative id.
            global_sees_all [B, G] bool: global tokens exempt from hard g2l (CLS, question,
                candidates).
            global_features [B, G, F] float32, F = config.global_feature_size: per-global-token
                features, projected and added to the embedding.
            long_example_ids [B, L] int64: the example each long token belongs to, in rows that
                pack several (no attention across examples; ETC's pretraining packs documents).
            global_example_ids [B, G] int64: the example each global token belongs to; given
                together with `long_example_ids`.
            input_ids: transformers' name (a tokenizer's output) for `long_input_ids`.
            attention_mask: transformers' name for `long_attention_mask`.
            token_type_ids: transformers' name for `long_token_type_ids`. Give one name of each pair.

        Returns:
            GlobalLocalModelOutput: `long_hidden_state` [B, L, H], `global_hidden_state` [B, G, H]
            and, when asked for (`keep_attention_weights`), each layer's `attention_weights`.

        Raises:
            ValueError: an input of the wrong name, shape or dtype, or (when checked) value, naming it.
            TypeError: a transformers' name given together with the long input's name it stands for.
        """
        config = self.config
        given = take_aliases(dict(
            long_input_ids=long_input_ids, global_input_ids=global_input_ids,
            long_attention_mask=long_attention_mask, global_attention_mask=global_attention_mask,
            long_token_type_ids=long_token_type_ids, global_token_type_ids=global_token_type_ids,
            sentence_ids=sentence_ids, mention_ids=mention_ids, long_paragraph_ids=long_paragraph_ids,
            global_paragraph_ids=global_paragraph_ids, global_sees_all=global_sees_all, global_features=global_features,
            long_example_ids=long_example_ids, global_example_ids=global_example_ids,
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
        ))
        structure = check_and_collect(config, given)
        long_input_ids, long_token_type_ids = given["long_input_ids"], given["long_token_type_ids"]
        batch, length = long_input_ids.shape
        long_hidden = self.embeddings(long_input_ids, long_token_type_ids)
        if global_input_ids is None:
            global_hidden = long_hidden.new_zeros(batch, 0, config.hidden_size)
        else:
            global_hidden = self.embeddings(global_input_ids, global_token_type_ids, global_features, is_global=True)

        side = build_side_inputs(
            structure,
            local_radius=config.local_radius,
            max_relative_distance=config.max_relative_distance if config.uses_relative_positions else None,
            hard_g2l=config.hard_g2l,
            hard_l2g=config.hard_l2g,
            local_attention_within_paragraph=config.local_attention_within_paragraph,
            dtype=long_hidden.dtype,
        )
        backend = resolve_backend(self.attention_backend or config.attention_backend, long_hidden.device,
                                  _attention_dtype(long_hidden))(
            # Without autograd, big buffers pass from layer to layer instead of being allocated afresh
            # (under tracing the compiler plans the memory); not when the weights are kept, which come
            # with the scores they were computed from (AttentionWeights), for the layers after to leave.
            reuse_buffers=(not torch.is_grad_enabled() and not torch.compiler.is_compiling()
                           and not self.keeps_attention_weights),
            keep_weights=self.keeps_attention_weights,
        )
        # Whole blocks inside the encoder; padded positions are masked as keys and cut off below.
        long_hidden = F.pad(long_hidden, (0, 0, 0, side.padded_length - length))
        long_hidden, global_hidden, weights = self.encoder(long_hidden, global_hidden, side, backend)
        # A copy, not a view: a view's strides would tie an exported program's length to the padding.
        # torch.narrow_copy traces without guards on the length but has no derivative before torch 2.13.
        long_hidden = (long_hidden[:, :length].clone(memory_format=torch.contiguous_format) if long_hidden.requires_grad
                       else torch.narrow_copy(long_hidden, 1, 0, length))
        return GlobalLocalModelOutput(long_hidden_state=long_hidden, global_hidden_state=global_hidden,
                                      attention_weights=weights)


class GlobalLocalEncoding(EncoderForward, nn.Module):
    """The ETC-style global-local encoder as a plain nn.Module (see `forward` for the inputs): the
    modules, state dict and outputs of `GlobalLocalModel`, built from a config alone."""

    def __init__(self, config: GlobalLocalConfig):
        nn.Module.__init__(self)
        self.config = config
        self.build(config)


def old_parameter_names(weights_file: str | Path) -> list[str]:
    """The keys of the safetensors file `weights_file` named as attention.OLD_PARAMETER_NAMES names them."""
    from safetensors import safe_open

    with safe_open(str(weights_file), "pt") as weights:
        return [key for key in weights.keys() if key.rsplit(".", 1)[-1] in OLD_PARAMETER_NAMES]


def refuse_old_parameter_names(folder: str | Path) -> None:
    """InputError when the local model folder `folder` holds weights under the old parameter names."""
    weights_file = Path(folder) / "model.safetensors"
    found = old_parameter_names(weights_file) if weights_file.is_file() else []
    if found:
        raise InputError(f"{weights_file}: {len(found)} attention weights under their old names ({found[0]}, ...); "
                         f"run `longdoc upgrade {folder}` once to rename them")


def _attention_dtype(hidden: Tensor) -> torch.dtype:
    """The dtype the attention computes in: the hidden states', or under autocast the projections'."""
    device = hidden.device.type
    if device in ("cpu", "cuda") and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return hidden.dtype
