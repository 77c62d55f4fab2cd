"""Preprocessing a whole dataset into features with `datasets`, in parallel and cached on disk.

Step 1: the task reader's examples become a `datasets.Dataset` of (id, example JSON) rows, built by
`Dataset.from_generator` in `cache_dir`; its fingerprint hashes the reader, the path and the
file's SHA-256, so an edited file is read again while an unchanged one is loaded from the cache.
Step 2: `Dataset.map(num_proc=...)` turns each example into one row per window
(`Features.to_dict()`); datasets fingerprints the function, tokenizer and settings, so a second
run with the same inputs loads the cached Arrow files instead of tokenising again.
"""

import hashlib
import os
from pathlib import Path
from typing import Callable, Iterable

from datasets import Dataset

from longdoc.data.examples import StructuredExample, example_from_json, example_to_json
from longdoc.data.features import FeatureSettings, GlobalMarkers, build_features

Reader = Callable[[str], Iterable[StructuredExample]]


def cached_features(
    reader: Reader,
    path: str | os.PathLike,
    tokenizer,
    settings: FeatureSettings,
    cache_dir: str | os.PathLike,
    num_proc: int | None = None,
    markers: GlobalMarkers | None = None,
) -> Dataset:
    """Features of every window of every example in `path` (one row per window), cached in `cache_dir`."""
    examples = Dataset.from_generator(
        _example_rows,
        gen_kwargs={"reader": reader, "path": str(path), "file_sha256": _sha256(path)},
        cache_dir=str(cache_dir),
    )
    return examples.map(
        _features_of_batch,
        batched=True,
        batch_size=16,
        num_proc=num_proc,
        remove_columns=examples.column_names,
        fn_kwargs={"tokenizer": tokenizer, "settings": settings,
                   "markers": markers or GlobalMarkers.from_tokenizer(tokenizer)},
        desc="features",
    )


def _example_rows(reader: Reader, path: str, file_sha256: str):
    # file_sha256 is unused here on purpose: it is part of the generator's fingerprint.
    for example in reader(path):
        yield {"id": example.id, "example": example_to_json(example)}


def _features_of_batch(batch: dict, tokenizer, settings: FeatureSettings, markers: GlobalMarkers) -> dict:
    rows = [
        features.to_dict()
        for text in batch["example"]
        for features in build_features(example_from_json(text), tokenizer, settings, markers)
    ]
    return {key: [row[key] for row in rows] for key in (rows[0] if rows else {})}


def _sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(Path(path), "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
