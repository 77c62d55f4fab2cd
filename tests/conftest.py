"""Shared fixtures and helpers: the real data samples in ../shared/data, MiniLM's tokenizer, a run's logged losses."""

import json
import os
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data beside the checkout. Absent in a user's clone: skip; absent under CI: fail."""
    if not SHARED_DATA.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the real data samples are missing: {SHARED_DATA}")
        pytest.skip(f"real data samples not found at {SHARED_DATA} (they live beside the checkout, in ../shared/data)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tokenizer():
    """MiniLM's uncased WordPiece tokenizer (the default one), loaded once."""
    from longdoc.convert.pretrained import default_tokenizer

    return default_tokenizer()


def logged_losses(out: Path) -> list[float]:
    """The training losses a run logged in its train_log.jsonl, in order."""
    return [record["loss"] for record in map(json.loads, (out / "train_log.jsonl").read_text().splitlines())
            if "loss" in record]


@pytest.fixture
def linear_backend(monkeypatch):
    """A function that forces LONGDOC_GEMM for the test: the choice is cached per process, so the
    cache is cleared on the way in and out."""
    from longdoc.model import linear

    def use(name: str) -> None:
        monkeypatch.setenv(linear.ENVIRONMENT_VARIABLE, name)
        linear.backend.cache_clear()

    yield use
    linear.backend.cache_clear()
