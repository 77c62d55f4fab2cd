"""--compile: `longdoc predict` with a tiny WikiHop model compiled by torch.compile predicts the
answers of the uncompiled one; where the compiler cannot run (no C++ compiler on the CPU, a device
it does not compile for) predict, train and bench say why in one line and exit 2."""

import json
import warnings

import pytest
import torch

from longdoc.cli import main
from longdoc.model.inference import compile_refusal
from tests.commands.test_predict_device import TRAIN, _predict, untrained  # noqa: F401 (a fixture)

NO_COMPILER = "/nonexistent/c++"


def test_compile_refusal_names_what_is_missing(monkeypatch):
    monkeypatch.setenv("CXX", NO_COMPILER)
    assert compile_refusal(torch.device("cpu")) == (f"torch.compile needs a C++ compiler on the CPU (CXX={NO_COMPILER} "
                                                    "is not a program on PATH)")
    assert compile_refusal(torch.device("mps")) == "torch.compile compiles for the CPU and CUDA here, not mps"


def test_predict_compile_without_a_compiler_exits_2_with_one_line(untrained, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CXX", NO_COMPILER)
    assert _predict(untrained, tmp_path / "pred.json", "--device", "cpu", "--compile") == 2
    err = capsys.readouterr().err
    assert err == ("longdoc predict: error: --compile: torch.compile needs a C++ compiler on the CPU "
                   f"(CXX={NO_COMPILER} is not a program on PATH)\n")
    assert not (tmp_path / "pred.json").exists()


def test_train_compile_without_a_compiler_exits_2_with_one_line(untrained, shared_data, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CXX", NO_COMPILER)
    model, _ = untrained
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        status = main(["--quiet", "train", "wikihop", "--config", "cpu", "--train", str(shared_data / TRAIN),
                       "--out", str(tmp_path / "run"), "--init", str(model.parent / "encoder"), "--long-max-len", "256",
                       "--global-max-len", "128", "--max-steps", "1", "--batch-size", "4", "--compile"])
    assert status == 2
    err = capsys.readouterr().err
    assert err.endswith("error: --compile: torch.compile needs a C++ compiler on the CPU "
                        f"(CXX={NO_COMPILER} is not a program on PATH)\n") and err.count("\n") == 1, err


@pytest.mark.slow  # inductor compiles the model's graphs (C++), about a minute
def test_predict_compiled_gives_the_answers_of_the_uncompiled_model(untrained, tmp_path, capsys, monkeypatch):
    compiled = []
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda *args, **kwargs: compiled.append(1) or real_compile(*args, **kwargs))
    assert _predict(untrained, tmp_path / "eager.json", "--device", "cpu") == 0
    assert not compiled
    assert _predict(untrained, tmp_path / "compiled.json", "--device", "cpu", "--compile") == 0
    assert compiled
    assert json.loads((tmp_path / "compiled.json").read_text()) == json.loads((tmp_path / "eager.json").read_text())


def test_bench_compile_without_a_compiler_exits_2_with_one_line(capsys, monkeypatch):
    monkeypatch.setenv("CXX", NO_COMPILER)
    assert main(["bench", "--plain", "--no-peers", "--lengths", "64", "--compile"]) == 2
    assert capsys.readouterr().err == ("longdoc bench: error: --compile: torch.compile needs a C++ compiler on the CPU "
                                       f"(CXX={NO_COMPILER} is not a program on PATH)\n")
