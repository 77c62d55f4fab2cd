"""Where longdoc keeps what it builds once (the compiled kernels here; lifted weights, indexes and
models elsewhere in the package, which find the folder through this module)."""

import os
from pathlib import Path

ENVIRONMENT_VARIABLE = "LONGDOC_CACHE"


def cache_dir() -> Path:
    """$LONGDOC_CACHE, else ~/.cache/longdoc."""
    return Path(os.environ.get(ENVIRONMENT_VARIABLE) or Path.home() / ".cache" / "longdoc")
