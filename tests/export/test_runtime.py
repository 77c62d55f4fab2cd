"""`--runtime onnx` of predict and ask: the exported graph in ONNX Runtime gives the PyTorch model's
prediction file and answers; a graph that does not match its folder's config, a folder without a
graph, and options the graph cannot honour are refused in one line with exit status 2."""

import json
import shutil

import pytest

from longdoc.cli import main
from longdoc.export.runtime import ONNX_FILE, GraphOutputs, load_onnx_model

HOTPOTQA_SAMPLE = "hotpotqa/hotpot_dev_distractor_v1.first53.json"


def predict(model_dir, data, out, *options) -> dict:
    return main(["predict", "hotpotqa", "--model", str(model_dir), "--data", str(data), "--out", str(out), "--quiet",
                 *options])


@pytest.mark.slow
def test_predict_with_onnx_runtime_writes_the_pytorch_models_prediction_file(exported_hotpotqa, shared_data, tmp_path,
                                                                             capsys):
    data = shared_data / HOTPOTQA_SAMPLE
    summaries = {}
    for runtime in ("torch", "onnx"):
        capsys.readouterr()
        assert predict(exported_hotpotqa, data, tmp_path / f"{runtime}.json", "--runtime", runtime, "--json") == 0
        summaries[runtime] = json.loads(capsys.readouterr().out)
    assert summaries["onnx"]["runtime"] == "onnx" and summaries["torch"]["runtime"] == "torch"
    assert summaries["onnx"]["windows"] == summaries["torch"]["windows"] > 53
    torch_file, onnx_file = (json.loads((tmp_path / f"{r}.json").read_text()) for r in ("torch", "onnx"))
    assert len(torch_file["answer"]) == 53 and onnx_file == torch_file


@pytest.mark.slow
def test_ask_with_onnx_runtime_gives_the_pytorch_readers_answers(tmp_path, exported_task_model, capsys):
    _, exported, _ = exported_task_model("span_reader")
    document = tmp_path / "notes.txt"
    document.write_text("The lighthouse on the northern cape was built in 1871 by Ada Marsh. It guided ships past "
                        "the reef for ninety years. The keeper's house now holds a small museum about the reef.\n")
    results = {}
    for runtime in ("torch", "onnx"):
        capsys.readouterr()
        assert main(["ask", "--model", str(exported), "--question", "Who built the lighthouse?",
                     "--top-k", "3", "--min-evidence", "-1", "--json", "--runtime", runtime, "--quiet",
                     str(document)]) == 0
        results[runtime] = json.loads(capsys.readouterr().out)
    assert results["onnx"]["mode"] == "span" and results["onnx"]["answers"]
    for got, expected in zip(results["onnx"]["answers"], results["torch"]["answers"], strict=True):
        assert (got["text"], got["start"], got["end"]) == (expected["text"], expected["start"], expected["end"])
        assert got["score"] == pytest.approx(expected["score"], abs=1e-5)


@pytest.mark.slow
def test_a_graph_that_does_not_match_its_config_is_refused(exported_hotpotqa, shared_data, tmp_path, capsys):
    edited = tmp_path / "edited"
    shutil.copytree(exported_hotpotqa, edited)
    config = json.loads((edited / "config.json").read_text())
    config["local_radius"] = 7
    (edited / "config.json").write_text(json.dumps(config))
    assert predict(edited, shared_data / HOTPOTQA_SAMPLE, tmp_path / "out.json", "--runtime", "onnx") == 2
    error = capsys.readouterr().err.strip()
    assert error == (f"longdoc predict: error: {edited / ONNX_FILE}: does not match {edited / 'config.json'}: the "
                     "graph was exported with local_radius = 16, the config has 7")
    assert not (tmp_path / "out.json").exists()
    # Decoding settings are not in the graph: a changed threshold is this folder's to choose.
    config["local_radius"] = 16
    config["task_options"]["sp_threshold"] = 0.3
    (edited / "config.json").write_text(json.dumps(config))
    assert load_onnx_model(edited).task_options["sp_threshold"] == 0.3
    (edited / ONNX_FILE).write_bytes(b"not a graph")
    assert predict(edited, shared_data / HOTPOTQA_SAMPLE, tmp_path / "out.json", "--runtime", "onnx") == 2
    assert f"{edited / ONNX_FILE}: not readable as an ONNX model" in capsys.readouterr().err


def test_runtime_onnx_is_refused_where_it_cannot_run(task_encoder, shared_data, tmp_path, capsys, monkeypatch):
    from longdoc.model import linear

    # As on a CPU with bfloat16 instructions: elsewhere --dtype bfloat16 is refused first, for the CPU.
    monkeypatch.setattr(linear, "bfloat16_instructions", lambda: True)
    data = shared_data / HOTPOTQA_SAMPLE
    assert predict(task_encoder, data, tmp_path / "out.json", "--runtime", "onnx") == 2
    assert capsys.readouterr().err.strip() == (
        f"longdoc predict: error: {task_encoder}: no {ONNX_FILE} for --runtime onnx; export the model first: "
        f"longdoc export --model {task_encoder} --out DIR")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / ONNX_FILE).write_bytes(b"")
    for options, message in ((["--dtype", "bfloat16"], "--runtime onnx runs the exported float32 graph"),
                             (["--attention", "eager"], "--attention eager chooses PyTorch's attention backend")):
        shutil.copy(task_encoder / "config.json", tmp_path / "folder" / "config.json")
        assert predict(tmp_path / "folder", data, tmp_path / "out.json", "--runtime", "onnx", *options) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_graph_outputs_read_as_attributes():
    outputs = GraphOutputs(start_logits=1)
    assert outputs.start_logits == 1 and outputs["start_logits"] == 1
    with pytest.raises(AttributeError):
        outputs.end_logits
