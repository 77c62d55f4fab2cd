"""Helpers shared by the task tests: tiny random encoders, published rows (MiniLM's tokenizer is
tests/conftest.py's `tokenizer`)."""

from pathlib import Path

import torch

from longdoc.model.config import GlobalLocalConfig
from longdoc.model.pretrained import GlobalLocalModel

# A tiny encoder for pipeline tests: fast on 2 cores, deterministic (no dropout); scores mean nothing.
TINY_ENCODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, local_radius=16,
                    max_relative_distance=4, relative_vocab_size=16, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)


def write_encoder(folder: Path, tokenizer, **config) -> Path:
    """A lifted-encoder folder as `--init` takes it: a random GlobalLocalModel (seed 0) with the
    tokenizer's vocabulary and `config`, and the tokenizer."""
    torch.manual_seed(0)
    GlobalLocalModel(GlobalLocalConfig(vocab_size=tokenizer.vocab_size, **config)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def span_answering_model(folder: Path, encoder: Path, tokenizer, model_class=None, **options) -> Path:
    """A model folder of `model_class` (default HotpotQAModel) started from `encoder` (seed 0), untrained
    but told to answer with spans (its answer type head puts "span" first), and the tokenizer: what
    `longdoc ask` reads spans and offsets with."""
    if model_class is None:
        from longdoc.tasks.hotpotqa.model import HotpotQAModel as model_class
    torch.manual_seed(0)
    model = model_class.from_encoder(encoder, **options)
    with torch.no_grad():
        model.type_head.projection.bias.copy_(torch.tensor([10.0, 0.0, 0.0]))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def assert_reference_rows_fit(task, metrics: dict) -> None:
    """Each published row of `task` names itself and its source and reports only keys that the
    task's metric really returns (`metrics`, one run of it), as fractions like the metric's own;
    otherwise the leaderboard would show an empty column or a figure on another scale beside our runs."""
    assert task.headline_metric in metrics
    for row in task.reference_rows:
        assert row["name"] and row["source"], row
        assert row["metrics"] and set(row["metrics"]) <= set(metrics), row
        assert all(0 < value <= 1 for value in row["metrics"].values()), row
