"""GlobalLocalConfig: the hyper-parameters of the ETC-style global-local encoder.

References: ETC (Ainslie et al., 2020, arXiv:2004.08483) for the global-local attention, relative
positions and structure masks; RealFormer (He et al., 2020, arXiv:2012.11747) for residual
attention; Talking-Heads Attention (Shazeer et al., 2020, arXiv:2003.02436).
Impossible combinations are refused at construction with a message naming the fields.
"""

from transformers import AutoConfig, PretrainedConfig

from longdoc.model.backends import BACKEND_NAMES

POSITION_EMBEDDING_TYPES = ("relative", "absolute", "both")

# Named architectures (fairseq style). ETC-base and ETC-large are the paper's shapes; "minilm" is
# the shape of all-MiniLM-L6-v2, the checkpoint longdoc ships lifted as its default.
PRESETS = {
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "large": dict(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
        max_relative_distance=24, relative_vocab_size=64,
    ),
    "minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
}


class GlobalLocalConfig(PretrainedConfig):
    """Configuration of `GlobalLocalModel`.

    Impossible combinations are refused at construction with a message naming the fields. The input
    conventions at the end (token types and global token ids) are read by longdoc's feature builders
    (`longdoc.data.features` and `longdoc.data.pretraining_corpus`), not by the model; a converted ETC
    checkpoint carries the conventions etcmodel's input code pretrained it with.

    Args:
        vocab_size: wordpieces in the vocabulary.
        hidden_size: width of the hidden states (H).
        num_hidden_layers: layers of the encoder.
        num_attention_heads: attention heads per layer; `hidden_size` must be a multiple of it.
        intermediate_size: width of the feed-forward's inner layer.
        hidden_act: the feed-forward's activation, a name in transformers' ACT2FN.
        hidden_dropout_prob: dropout on the embeddings and on each sublayer's output.
        attention_probs_dropout_prob: dropout on the attention weights.
        layer_norm_eps: epsilon of every LayerNorm.
        initializer_range: standard deviation of the normal weight initialisation.
        type_vocab_size: token types in the token type embedding.
        pad_token_id: the padding wordpiece's id (the word embedding's padding index).
        long_max_len: the most long wordpieces an input row may hold.
        global_max_len: the most global tokens an input row may hold.
        local_radius: each long token sees long tokens at most this far away (ETC-base 84); the
            attention blocks hold `local_radius + 1` long tokens.
        position_embedding_type: "relative" (ETC: per-layer relative key/bias tables, ids clipped at
            `max_relative_distance`), "absolute" (BERT position embeddings on the long input), or
            "both".
        max_position_embeddings: rows of the absolute position table; with absolute positions, at
            least `long_max_len` and `global_max_len`.
        max_relative_distance: relative positions farther apart than this share one id (at least 1).
        relative_vocab_size: ids of the relative key/bias tables; at least
            `2 * max_relative_distance + 4` (right, left, linked, not linked, other paragraph).
        hard_g2l: a global token sees only its own long tokens, unless it is marked as seeing
            everything (the `global_sees_all` input).
        hard_l2g: a long token sees only its own global tokens.
        local_attention_within_paragraph: no local attention across paragraphs.
        residual_attention: RealFormer: carry each layer's raw scores to the next, per attention
            piece.
        residual_attention_mean: divide the carried sum by the layer number before the softmax;
            needs `residual_attention`.
        talking_heads: learned head mixing before and after the softmax, identity at initialisation.
        pre_layer_norm: pre-LN layers; off, post-LN (RealFormer's choice).
        share_qkv: one query/key/value projection for both streams.
        share_attention_output: one attention output projection for both streams.
        share_feed_forward: one feed-forward for both streams.
        cross_kv_projections: the keys and values long queries read from global tokens, and global
            queries from long tokens, get projections of their own (ETC's l2g and g2l projections,
            set for converted ETC checkpoints without `share_qkv_projections`); off, every token's
            keys and values come from its own stream's projection, for both softmaxes. Needs
            `share_qkv` off.
        global_feature_size: size of a per-global-token feature vector (OpenKP's visual features)
            projected into the global embedding; 0 for none.
        separate_global_embedding_norm: the global embeddings get a LayerNorm of their own (ETC's
            `global_emb_layer_norm`, set for converted ETC checkpoints); off, both streams share one,
            which is what a model lifted from a BERT checkpoint's single embedding norm starts from.
        global_absolute_positions: with absolute positions, global token g also adds the position
            embedding of index g (as the long token at g does); off, global tokens get none: they
            are structure, not text at a position. Lifted models set it off; on, the default, is
            what a saved config without the field computes.
        attention_backend: how the attention is computed (longdoc.model.backends): "auto" (the C++
            kernels on the CPU in float32, the GPU kernel on CUDA where available, else "eager"),
            "eager" (PyTorch ops, the specification), "cpu", "gpu", or "dense" (a float64
            reference, slow). A choice at run time (`GlobalLocalModel.set_attention_backend`, the
            commands' --attention) overrides it; a saved config without the field gets "auto".
        long_question_token_type_id: the token type of the long [CLS] question [SEP] prefix.
        long_document_token_type_id: the token type of the document's long tokens and the final
            [SEP] (every pretraining long token); None: 1, or 0 for a model with one token type.
        global_question_token_type_id: the token type of the CLS and question globals.
        global_structure_token_type_id: the token type of every other global (every pretraining
            global); None: 1, or 0 for a model with one token type.
        global_token_ids: the input ids of the "paragraph", "sentence", "candidate" and "dom_node"
            globals, and optionally "question" (every question global, which otherwise carries its
            question wordpiece) and "cpc_mask" (the global token of a sentence masked for CPC, which
            otherwise keeps the sentence id); None: chosen from the tokenizer
            (`longdoc.data.features.GlobalMarkers.from_tokenizer`).
        **kwargs: transformers' `PretrainedConfig` arguments.

    Raises:
        ValueError: an impossible value or combination, naming the fields.
    """

    model_type = "longdoc-global-local"

    def __init__(
        self,
        vocab_size: int = 30522,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        layer_norm_eps: float = 1e-12,
        initializer_range: float = 0.02,
        type_vocab_size: int = 2,
        pad_token_id: int = 0,
        long_max_len: int = 4096,
        global_max_len: int = 256,
        local_radius: int = 84,
        position_embedding_type: str = "relative",
        max_position_embeddings: int = 512,
        max_relative_distance: int = 12,
        relative_vocab_size: int = 32,
        hard_g2l: bool = True,
        hard_l2g: bool = False,
        local_attention_within_paragraph: bool = False,
        residual_attention: bool = True,
        residual_attention_mean: bool = False,
        talking_heads: bool = False,
        pre_layer_norm: bool = False,
        share_qkv: bool = False,
        share_attention_output: bool = False,
        share_feed_forward: bool = False,
        cross_kv_projections: bool = False,
        global_feature_size: int = 0,
        separate_global_embedding_norm: bool = False,
        global_absolute_positions: bool = True,
        attention_backend: str = "auto",
        # --- input conventions (see the class docstring) ---
        long_question_token_type_id: int = 0,
        long_document_token_type_id: int | None = None,
        global_question_token_type_id: int = 0,
        global_structure_token_type_id: int | None = None,
        global_token_ids: dict[str, int] | None = None,
        **kwargs,
    ):
        super().__init__(pad_token_id=pad_token_id, **kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        self.type_vocab_size = type_vocab_size
        self.long_max_len = long_max_len
        self.global_max_len = global_max_len
        self.local_radius = local_radius
        self.position_embedding_type = position_embedding_type
        self.max_position_embeddings = max_position_embeddings
        self.max_relative_distance = max_relative_distance
        self.relative_vocab_size = relative_vocab_size
        self.hard_g2l = hard_g2l
        self.hard_l2g = hard_l2g
        self.local_attention_within_paragraph = local_attention_within_paragraph
        self.residual_attention = residual_attention
        self.residual_attention_mean = residual_attention_mean
        self.talking_heads = talking_heads
        self.pre_layer_norm = pre_layer_norm
        self.share_qkv = share_qkv
        self.share_attention_output = share_attention_output
        self.share_feed_forward = share_feed_forward
        self.cross_kv_projections = cross_kv_projections
        self.global_feature_size = global_feature_size
        self.separate_global_embedding_norm = separate_global_embedding_norm
        self.global_absolute_positions = global_absolute_positions
        self.attention_backend = attention_backend
        # --- input conventions ---
        self.long_question_token_type_id = long_question_token_type_id
        # None: type 1, or 0 where the model has one token type (RoBERTa's family).
        second_type = min(1, self.type_vocab_size - 1)
        self.long_document_token_type_id = second_type if long_document_token_type_id is None else long_document_token_type_id
        self.global_question_token_type_id = global_question_token_type_id
        self.global_structure_token_type_id = (second_type if global_structure_token_type_id is None
                                               else global_structure_token_type_id)
        self.global_token_ids = None if global_token_ids is None else dict(global_token_ids)
        self._validate()
        self._validate_input_conventions()

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "GlobalLocalConfig":
        """A named architecture ("base", "large", "minilm") with any field overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def block_size(self) -> int:
        """Long tokens per attention block: r + 1, so a block and its two neighbours cover every window."""
        return self.local_radius + 1

    @property
    def uses_relative_positions(self) -> bool:
        return self.position_embedding_type in ("relative", "both")

    @property
    def uses_absolute_positions(self) -> bool:
        return self.position_embedding_type in ("absolute", "both")

    def _validate(self) -> None:
        def require(condition: bool, message: str) -> None:
            if not condition:
                raise ValueError(f"GlobalLocalConfig: {message}")

        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "long_max_len", "type_vocab_size"):
            require(getattr(self, name) > 0, f"{name} must be positive, got {getattr(self, name)}")
        require(self.global_max_len >= 0, f"global_max_len must be >= 0, got {self.global_max_len}")
        require(self.local_radius >= 0, f"local_radius must be >= 0, got {self.local_radius}")
        require(self.global_feature_size >= 0, f"global_feature_size must be >= 0, got {self.global_feature_size}")
        require(
            self.hidden_size % self.num_attention_heads == 0,
            f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads ({self.num_attention_heads})",
        )
        require(
            self.position_embedding_type in POSITION_EMBEDDING_TYPES,
            f"position_embedding_type must be one of {POSITION_EMBEDDING_TYPES}, got {self.position_embedding_type!r}",
        )
        if self.uses_absolute_positions:
            # Absolute positions index a table: the long input can be no longer than it.
            require(
                self.max_position_embeddings >= max(self.long_max_len, self.global_max_len),
                f"position_embedding_type={self.position_embedding_type!r} needs max_position_embeddings "
                f"({self.max_position_embeddings}) >= long_max_len ({self.long_max_len}) and global_max_len "
                f"({self.global_max_len})",
            )
        if self.uses_relative_positions:
            # ids 0..k (right), k+1..2k (left), 2k+1 linked, 2k+2 not linked, 2k+3 other paragraph
            require(self.max_relative_distance >= 1, f"max_relative_distance must be >= 1, got {self.max_relative_distance}")
            require(
                self.relative_vocab_size >= 2 * self.max_relative_distance + 4,
                f"relative_vocab_size ({self.relative_vocab_size}) must be at least 2 * max_relative_distance + 4 "
                f"= {2 * self.max_relative_distance + 4}",
            )
        require(
            not (self.cross_kv_projections and self.share_qkv),
            "cross_kv_projections=True needs share_qkv=False (shared projections have no per-stream keys to separate)",
        )
        require(
            not self.residual_attention_mean or self.residual_attention,
            "residual_attention_mean=True needs residual_attention=True",
        )
        require(self.attention_backend in BACKEND_NAMES,
                f"attention_backend must be one of {', '.join(BACKEND_NAMES)}, got {self.attention_backend!r}")

    # --- input conventions ---
    GLOBAL_TOKEN_KINDS = ("paragraph", "sentence", "candidate", "dom_node")
    OPTIONAL_GLOBAL_TOKEN_KINDS = ("question", "cpc_mask")

    def _validate_input_conventions(self) -> None:
        for name in ("long_question_token_type_id", "long_document_token_type_id", "global_question_token_type_id",
                     "global_structure_token_type_id"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value < self.type_vocab_size:
                raise ValueError(f"GlobalLocalConfig: {name} must be an int in [0, {self.type_vocab_size - 1}] "
                                 f"(type_vocab_size), got {value!r}")
        if self.global_token_ids is None:
            return
        kinds = set(self.global_token_ids)
        missing = [k for k in self.GLOBAL_TOKEN_KINDS if k not in kinds]
        unknown = sorted(kinds - set(self.GLOBAL_TOKEN_KINDS) - set(self.OPTIONAL_GLOBAL_TOKEN_KINDS))
        if missing or unknown:
            raise ValueError(f"GlobalLocalConfig: global_token_ids needs the kinds "
                             f"{', '.join(self.GLOBAL_TOKEN_KINDS)} (optionally {', '.join(self.OPTIONAL_GLOBAL_TOKEN_KINDS)}); missing: "
                             f"{', '.join(missing) or 'none'}, unknown: {', '.join(unknown) or 'none'}")
        for kind, token_id in self.global_token_ids.items():
            if not isinstance(token_id, int) or not 0 <= token_id < self.vocab_size:
                raise ValueError(f"GlobalLocalConfig: global_token_ids[{kind!r}] must be an int in "
                                 f"[0, {self.vocab_size - 1}] (vocab_size), got {token_id!r}")


# transformers' documented registration of a custom config: AutoConfig on a longdoc folder gives this class
# in any program that has it (the model modules register theirs beside it).
AutoConfig.register(GlobalLocalConfig.model_type, GlobalLocalConfig, exist_ok=True)
