"""`longdoc export` of every kind of model folder: each task head and a span reader exported and
checked against PyTorch at several lengths; the folder and its card; bad input refused in one line
with exit status 2 and nothing written."""

import json

import pytest

from longdoc.cli import main
from longdoc.export.check import TOLERANCE, ExportMismatch
from longdoc.export.graph import traced_length
from longdoc.export.runtime import ONNX_FILE
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.span_reader import SpanReader
from tests.export.conftest import KINDS, write_task_model


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_every_task_head_exports_with_the_models_outputs_at_several_lengths(kind, exported_task_model):
    model_dir, out, card = exported_task_model(kind)  # (`longdoc export --json`: the record it printed)
    assert card == json.loads((out / "export.json").read_text())
    config = GlobalLocalConfig.from_pretrained(model_dir)
    lengths = {check["length"] for check in card["checks"]}
    assert len(lengths) >= 3 and traced_length(config) not in lengths and max(lengths) == config.long_max_len
    assert any(length % (config.local_radius + 1) for length in lengths)
    assert card["model"] == kind and card["opset"] == 18 and set(card["max_difference"]) == set(card["signature"]["outputs"])
    assert all(value < TOLERANCE for value in card["max_difference"].values())
    names = [entry["name"] for entry in card["signature"]["inputs"]]
    assert ("global_input_ids" in names) == (kind != "span_reader")
    assert {"config.json", "model.safetensors", "tokenizer.json", ONNX_FILE, "export.json", "README.md"} <= {
        path.name for path in out.iterdir()}
    card_text = (out / "README.md").read_text()
    assert f"opset 18" in card_text and str(config.long_max_len) in card_text


def test_a_folder_that_is_not_a_longdoc_model_is_refused(tmp_path, capsys):
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    for folder, message in ((tmp_path / "missing", "no such folder"), (tmp_path / "bert", "not a longdoc model")):
        assert main(["export", "--model", str(folder), "--out", str(tmp_path / "out")]) == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith("longdoc export: error: ") and message in error and "\n" not in error
        assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_an_opset_too_old_is_refused_naming_the_operator_and_nothing_is_written(tmp_path, tmp_path_factory,
                                                                                task_encoder, tokenizer, capsys):
    # A span reader: the refusal comes after the graph is traced, and its graph (no global tokens) traces
    # in half an encoder's time; the converter meets the same operator.
    model = write_task_model(tmp_path_factory.mktemp("opset") / "model", SpanReader.task_name, task_encoder, tokenizer)
    assert main(["export", "--model", str(model), "--out", str(tmp_path / "out"), "--opset", "16", "--quiet"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("longdoc export: error: --opset 16: ONNX's version converter cannot take operator ") and "\n" not in error
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


def test_a_graph_that_differs_from_the_model_is_refused_and_nothing_is_written(tmp_path, task_encoder, monkeypatch,
                                                                               capsys):
    from onnx import TensorProto, helper

    def differing(*args, **kwargs):
        raise ExportMismatch("the ONNX model's long_hidden_state differs from PyTorch's by 0.5 at 45 long tokens and "
                             "5 global tokens (allowed 0.0001); nothing was written")

    identity = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "identity", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]), opset_imports=[helper.make_opsetid("", 18)])
    monkeypatch.setattr("longdoc.export.folder.export_onnx", lambda *args: identity)  # (the check is what is tested)
    monkeypatch.setattr("longdoc.export.folder.compare", differing)
    assert main(["export", "--model", str(task_encoder), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    error = capsys.readouterr().err
    assert "differs from PyTorch's by 0.5 at 45 long tokens" in error and error.count("\n") == 1
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []
