"""Tiny model folders of every kind `longdoc export` takes, and exports of them shared by the tests
(an export of a tiny model takes seconds: each kind of folder and each encoder variant is exported once
per test run). Without the onnx extra the tests skip, saying why; under CI=true (which installs it with
the test extra) they fail instead."""

import contextlib
import io
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from longdoc import GlobalLocalModel
from longdoc.convert.pretrained import default_tokenizer
from longdoc.export.graph import export_onnx
from longdoc.export.signature import signature_of
from longdoc.model.span_reader import SpanReader
from longdoc.tasks import get_task
from tests.conftest import run_folder
from tests.model.conftest import tiny_config
from tests.tasks.conftest import TINY_ENCODER, write_encoder

# Encoders of each architecture variant (tiny_config's three layers unless said), exported and checked against
# PyTorch at several lengths: every flag of the attention and the layers.
VARIANTS = {
    # ETC as converted: relative ids with links, residual attention (running mean), talking heads, the
    # cross projections, hard g2l and l2g, no local attention across paragraphs, a global embedding norm
    "etc": dict(residual_attention=True, residual_attention_mean=True, talking_heads=True, cross_kv_projections=True,
                hard_l2g=True, local_attention_within_paragraph=True, separate_global_embedding_norm=True),
    # a lifted BERT: absolute positions, no carried scores, pre-LN, shared projections and feed-forward;
    # two layers (one feeding the next: with no scores carried, a third traces nothing new)
    "lifted": dict(position_embedding_type="absolute", residual_attention=False, pre_layer_norm=True, share_qkv=True,
                   share_attention_output=True, share_feed_forward=True, global_absolute_positions=False,
                   num_hidden_layers=2),
}

# Lengths the task tests read: the HotpotQA sample's windows fit 512 long tokens with 128 globals. One
# layer: what these tests export is each head and folder on an encoder, and tracing a layer is most of an
# export's time; the graph of several layers (the scores carried between them) is tests/export/test_graph.py's.
TASK_ENCODER = dict(TINY_ENCODER, long_max_len=512, global_max_len=128, talking_heads=True, num_hidden_layers=1)
# Options each task model needs to fit that encoder (question globals within global_max_len).
TASK_OPTIONS = {"hotpotqa": dict(max_question_len=32, type_from_question=True), "wikihop": dict(max_question_len=32),
                "nq": dict(max_question_len=32, stride=64), "openkp": {}}
# The kinds of model folder `longdoc export` takes: each task's model and a span reader.
KINDS = (*TASK_OPTIONS, SpanReader.task_name)


ONNX_EXTRA = ("onnx", "onnxscript", "onnxruntime")


@pytest.fixture(scope="session", autouse=True)
def _onnx_extra() -> None:
    for module in ONNX_EXTRA:
        try:
            __import__(module)
        except ImportError:
            reason = f'the onnx extra is not installed ({module}): pip install -e ".[onnx]"'
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI=true but {reason}")
            pytest.skip(reason)


@pytest.fixture(scope="session")
def tokenizer():
    return default_tokenizer()


@pytest.fixture(scope="session")
def task_encoder(tmp_path_factory, tokenizer) -> Path:
    return write_encoder(tmp_path_factory.mktemp("export_encoder"), tokenizer, **TASK_ENCODER)


def write_task_model(folder: Path, task: str, encoder: Path, tokenizer) -> Path:
    """A task model (fresh heads, seed 0) on the tiny encoder, saved with the tokenizer."""
    torch.manual_seed(0)
    model_class = SpanReader if task == SpanReader.task_name else get_task(task).load("model")
    model = model_class.from_encoder(encoder, **TASK_OPTIONS.get(task, {}))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def exported_task_model(tmp_path_factory, task_encoder, tokenizer):
    """A function: a kind of KINDS -> (its model folder (write_task_model's), the folder `longdoc export
    --json --quiet` wrote from it, the record that command printed). Each kind is exported once in a
    test run: pytest-xdist's workers read the folders the first wrote (the same seed, the same weights)."""
    from longdoc.cli import main

    def exported(kind: str) -> tuple[Path, Path, dict]:
        with run_folder(tmp_path_factory, f"export-{kind}") as folder:
            model, out, printed = folder / "model", folder / "exported", folder / "printed.json"
            if not printed.exists():
                shutil.rmtree(model, ignore_errors=True)
                shutil.rmtree(out, ignore_errors=True)
                write_task_model(model, kind, task_encoder, tokenizer)
                with contextlib.redirect_stdout(io.StringIO()) as stdout:
                    assert main(["export", "--model", str(model), "--out", str(out), "--json", "--quiet"]) == 0
                printed.with_suffix(".partial").write_text(stdout.getvalue())
                printed.with_suffix(".partial").rename(printed)
            return model, out, json.loads(printed.read_text())

    return exported


@pytest.fixture(scope="session")
def exported_hotpotqa(exported_task_model) -> Path:
    """A HotpotQA model exported with `longdoc export` (its folder: model.onnx beside the model)."""
    return exported_task_model("hotpotqa")[1]


@pytest.fixture(scope="session")
def exported_variant(tmp_path_factory):
    """A function: a VARIANTS name -> (its encoder (seed 0, eval mode), its signature, an ONNX Runtime
    session of its graph). The graph is exported once in a test run: pytest-xdist's workers read the
    file the first wrote (a model of the same seed has the same weights)."""
    import onnxruntime

    def exported(name: str):
        torch.manual_seed(0)
        model = GlobalLocalModel(tiny_config(**VARIANTS[name])).eval()
        signature = signature_of(model)
        with run_folder(tmp_path_factory, f"export-{name}") as folder:
            graph = folder / "model.onnx"
            if not graph.exists():
                partial = graph.with_suffix(".partial")
                partial.write_bytes(export_onnx(model, signature).SerializeToString())
                partial.rename(graph)
            graph_bytes = graph.read_bytes()
        return model, signature, onnxruntime.InferenceSession(graph_bytes, providers=["CPUExecutionProvider"])

    return exported
