"""The global-local encoder as transformers models: `GlobalLocalModel` (AutoModel's class for a longdoc
folder) and `EncoderWithHeads`, the base of the task and pretraining models.

They wrap the modules of longdoc.model.modeling (the same modules under the same names, so the same
state dict and outputs as `GlobalLocalEncoding`) in transformers' `PreTrainedModel`: from_pretrained,
save_pretrained, the Auto classes, weight initialisation and activation checkpointing. Importing this
module imports `transformers.modeling_utils`, which inference on torch alone
(longdoc.model.plain_reader) does not.
"""

from pathlib import Path
from typing import Any, ClassVar

from torch import nn
from transformers import AutoModel, PreTrainedModel
from transformers import initialization as init

from longdoc.errors import InputError, ModelFolderError
from longdoc.model.attention import SoftmaxParameters
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.encoder_folder import describe_checkpoint, readable_weights
from longdoc.model.modeling import (
    HEAD_KEYS, EncoderForward, keep_attention_weights, refuse_old_parameter_names, set_attention_backend,
)


class GlobalLocalPreTrainedModel(PreTrainedModel):
    config_class = GlobalLocalConfig
    base_model_prefix = "encoder"  # the attribute task models hold it under (BertModel: "bert")
    supports_gradient_checkpointing = True
    _no_split_modules = ["GlobalLocalLayer"]

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' from_pretrained; a folder whose weights carry the attention's old parameter
        names (attention.OLD_PARAMETER_NAMES) is refused with the command that renames them."""
        refuse_old_parameter_names(pretrained_model_name_or_path)
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    def set_attention_backend(self, name: str | None) -> None:
        """longdoc.model.modeling.set_attention_backend on this model."""
        set_attention_backend(self, name)

    def keep_attention_weights(self, keep: bool = True) -> None:
        """longdoc.model.modeling.keep_attention_weights on this model."""
        keep_attention_weights(self, keep)

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, **kwargs):
        """transformers' activation checkpointing (also reached from the deprecated
        `gradient_checkpointing_enable`), non-reentrant only: reentrant checkpointing gave wrong
        gradients here (against no checkpointing, with and without residual attention), so it is
        refused rather than left to train silently on them."""
        if (activation_checkpointing_kwargs or {}).get("use_reentrant", False):
            raise ValueError(f"{type(self).__name__} supports non-reentrant activation checkpointing only: pass "
                             "use_reentrant=False (transformers' default); reentrant checkpointing gives wrong "
                             "gradients for this model")
        super().activation_checkpointing_enable(activation_checkpointing_kwargs, **kwargs)

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, SoftmaxParameters):
            if module.relative_key is not None:
                init.normal_(module.relative_key, mean=0.0, std=self.config.initializer_range)
                init.normal_(module.relative_bias, mean=0.0, std=self.config.initializer_range)
            if module.talking_heads_pre is not None:
                init.eye_(module.talking_heads_pre)
                init.eye_(module.talking_heads_post)


class GlobalLocalModel(EncoderForward, GlobalLocalPreTrainedModel):
    """The ETC-style global-local encoder (longdoc.model.modeling: its modules and `forward`, for the
    inputs), a transformers model."""

    # transformers' patterns of checkpoint keys this model leaves out knowingly: a task model's folder
    # holds the encoder under `encoder.` (stripped as the base model's prefix) and its heads beside it,
    # and AutoModel on it gives the encoder, as BertModel from a BertForQuestionAnswering folder. So
    # every key outside the encoder's own modules (`embeddings.`, `encoder.`) is a head's; a key
    # inside them that this model lacks is still reported. A model of encoder plus heads drops the
    # pattern it inherits from here (EncoderWithHeads.post_init): its heads' keys are its own.
    _keys_to_ignore_on_load_unexpected = [HEAD_KEYS]

    def __init__(self, config: GlobalLocalConfig):
        super().__init__(config)
        self.build(config)
        self.post_init()


class EncoderWithHeads(GlobalLocalPreTrainedModel):
    """`self.encoder` (a GlobalLocalModel) plus the heads a subclass adds in `__init__(config)`."""

    base_model_prefix = "encoder"
    # Trained tasks whose folders also hold an encoder to start from (a lifted span reader's).
    encoder_sources: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: GlobalLocalConfig):
        super().__init__(config)
        self.encoder = GlobalLocalModel(config)

    def post_init(self) -> None:
        """transformers' post_init, less the encoder's pattern of head keys it gathers from `self.encoder`
        (modeling.HEAD_KEYS): this model's heads are its own, and keys it does not have are reported."""
        super().post_init()
        self._keys_to_ignore_on_load_unexpected.discard(HEAD_KEYS)

    @classmethod
    def from_encoder(cls, directory: str | Path, encoder_config: dict[str, Any] | None = None,
                     **config_fields) -> "EncoderWithHeads":
        """A new model of this class: the encoder weights in `directory`, fresh heads (drawn from the
        current torch seed). `encoder_config` overrides encoder settings that need no new weights or
        that start fresh (lengths, `residual_attention`, `talking_heads` starting at identity);
        `config_fields` are set on the config before the model is built."""
        found = describe_checkpoint(directory)
        if found.get("task") and found["task"] not in cls.encoder_sources:
            raise ModelFolderError(f"{directory}: holds a trained {found['task']} model, not a lifted encoder",
                                   directory, found["task"], "")
        with readable_weights(directory):
            try:
                encoder = GlobalLocalModel.from_pretrained(directory, **(encoder_config or {}))
            except ValueError as error:
                raise InputError(f"{directory}: cannot start a {cls.__name__} from this encoder: {error}") from None
        config = encoder.config
        for name, value in config_fields.items():
            setattr(config, name, value)
        model = cls(config)
        # Parameters the encoder folder lacks (e.g. talking-heads matrices when switching them on)
        # were initialised by from_pretrained; copy them as they are.
        model.encoder.load_state_dict(encoder.state_dict())
        return model


# transformers' documented registration of a custom model: AutoModel on a longdoc folder (a task model's
# too: its encoder) gives this class in any program that has it.
AutoModel.register(GlobalLocalConfig, GlobalLocalModel, exist_ok=True)
