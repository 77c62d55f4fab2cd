"""What the encoder benchmark measures: model shape, the variants compared, lengths and run options.

Plain frozen dataclasses that round-trip through JSON, because each measurement runs in a fresh
process that receives its `Job` on stdin.
"""

from dataclasses import asdict, dataclass, field, replace

from longdoc.model.config import PRESETS

FORWARD = "forward"
TRAIN = "forward+backward"
MODES = (FORWARD, TRAIN)

OURS = "ours"
LONGFORMER = "longformer"
BIGBIRD = "bigbird"
BERT = "bert"

FULL_LENGTHS = (1024, 2048, 4096, 8192, 16384)
QUICK_LENGTHS = (1024, 4096)
# The three peers take minutes per run beyond 8k long tokens on a 2-core CPU.
PEER_MAX_LENGTH = 8192


@dataclass(frozen=True)
class Shape:
    """The transformer shape every model in one run shares, and our encoder's attention shape."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    local_radius: int = 84
    global_tokens: int = 256
    vocab_size: int = 30522

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "Shape":
        """Sizes from a GlobalLocalConfig preset (the default run uses "minilm")."""
        preset = PRESETS[name]
        sizes = dict(
            hidden_size=preset["hidden_size"],
            num_layers=preset["num_hidden_layers"],
            num_heads=preset["num_attention_heads"],
            intermediate_size=preset["intermediate_size"],
        )
        return cls(**{**sizes, **overrides})

    def tokens_per_global(self, length: int) -> int:
        """Consecutive long tokens owned by each global token, so that the globals cover all of them."""
        return -(-length // self.global_tokens)


@dataclass(frozen=True)
class Variant:
    """One model in the comparison: our encoder with its flags, or a peer from transformers."""

    name: str
    family: str
    residual_attention: bool = False
    talking_heads: bool = False

    @property
    def is_ours(self) -> bool:
        return self.family == OURS


OURS_RESIDUAL = Variant("ours(res)", OURS, residual_attention=True)
OURS_PLAIN = Variant("ours(plain)", OURS)
OURS_RESIDUAL_TALKING = Variant("ours(res,th)", OURS, residual_attention=True, talking_heads=True)
OURS_TALKING = Variant("ours(th)", OURS, talking_heads=True)
OUR_VARIANTS = (OURS_RESIDUAL, OURS_PLAIN, OURS_RESIDUAL_TALKING, OURS_TALKING)
# The row every ratio divides by: the encoder's default configuration (residual on, no talking heads).
REFERENCE = OURS_RESIDUAL
PEERS = (Variant(LONGFORMER, LONGFORMER), Variant(BIGBIRD, BIGBIRD), Variant(BERT, BERT))


@dataclass(frozen=True)
class BenchSettings:
    """One benchmark run. Peers run at lengths up to `peer_max_length` only.

    Peer attention: Longformer's `longformer_window` is the whole window (both sides); BigBird runs
    block-sparse with `bigbird_block_size` and `bigbird_random_blocks`. `plain_process`: measure
    every model interleaved in this one process (longdoc.bench.plain), each peer reading the same
    L-token document as ours; otherwise each measurement in a fresh process, each peer reading L + G.
    """

    shape: Shape = field(default_factory=lambda: Shape.from_preset("minilm"))
    lengths: tuple = FULL_LENGTHS
    variants: tuple = OUR_VARIANTS + PEERS
    repeats: int = 3
    threads: int = 0  # 0: torch's default (one per core)
    dtype: str = "float32"
    device: str = "cpu"
    allocator: str = "keep"  # see longdoc.cpu_memory; the CLI's default picks jemalloc where found
    peer_max_length: int = PEER_MAX_LENGTH
    plain_process: bool = False
    longformer_window: int = 512
    bigbird_block_size: int = 64
    bigbird_random_blocks: int = 3
    matmul_size: int = 2048
    matmul_repeats: int = 5
    seed: int = 0
    attention: str = "auto"  # our encoder's attention backend (longdoc.model.backends)
    compile: bool = False  # our encoder compiled by torch.compile (the peers as users run them)

    @classmethod
    def quick(cls, **overrides) -> "BenchSettings":
        """A short run: 1k and 4k, one repeat, our default variant and the peers."""
        return cls(**{"lengths": QUICK_LENGTHS, "repeats": 1, "variants": (OURS_RESIDUAL,) + PEERS, **overrides})

    @classmethod
    def plain_quick(cls, **overrides) -> "BenchSettings":
        """A short plain-process run: 1k and 4k, two interleaved rounds, ours with and without talking
        heads and the peers."""
        return cls(**{
            "lengths": QUICK_LENGTHS, "repeats": 2, "variants": (OURS_RESIDUAL, OURS_RESIDUAL_TALKING) + PEERS,
            "plain_process": True, **overrides,
        })

    @property
    def peer_tokens_extra(self) -> int:
        """Tokens a peer reads beyond the L long tokens: G in the fresh-process run, none in the plain one."""
        return 0 if self.plain_process else self.shape.global_tokens

    def jobs(self) -> list["Job"]:
        """Every (variant, length, mode) this run measures, shortest lengths first."""
        return [
            Job(self, variant, length, mode)
            for length in self.lengths
            for variant in self.variants
            if variant.is_ours or length <= self.peer_max_length
            for mode in MODES
        ]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "BenchSettings":
        return cls(**{
            **data,
            "shape": Shape(**data["shape"]),
            "lengths": tuple(data["lengths"]),
            "variants": tuple(Variant(**variant) for variant in data["variants"]),
        })

    def without_peers(self) -> "BenchSettings":
        return replace(self, variants=tuple(variant for variant in self.variants if variant.is_ours))


@dataclass(frozen=True)
class Job:
    """One measurement: a variant at one length in one mode, run in its own process."""

    settings: BenchSettings
    variant: Variant
    length: int
    mode: str

    def to_dict(self) -> dict:
        return {"settings": self.settings.to_dict(), "variant": asdict(self.variant), "length": self.length, "mode": self.mode}

    @classmethod
    def from_dict(cls, data: dict) -> "Job":
        return cls(BenchSettings.from_dict(data["settings"]), Variant(**data["variant"]), data["length"], data["mode"])
