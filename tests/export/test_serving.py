"""`--runtime auto` picks ONNX Runtime where the folder has a graph and the figures say it is the faster
runtime on the device (longdoc.export.serving.FASTER_RUNTIME), else PyTorch."""

import pytest
import torch

from longdoc.errors import InputError
from longdoc.export import serving
from longdoc.export.runtime import ONNX_FILE
from longdoc.export.serving import resolve_runtime


def test_auto_follows_the_faster_runtime_of_the_device_where_the_folder_has_a_graph(tmp_path, monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    (tmp_path / ONNX_FILE).write_bytes(b"")
    # A graph, but no figures saying ONNX Runtime is the faster one: PyTorch's.
    monkeypatch.setattr(serving, "FASTER_RUNTIME", {})
    assert resolve_runtime("auto", tmp_path, cpu) == "torch"
    monkeypatch.setattr(serving, "FASTER_RUNTIME", {"cpu": "torch"})
    assert resolve_runtime("auto", tmp_path, cpu) == "torch"
    # Where the figures would have ONNX Runtime faster on the CPU:
    monkeypatch.setattr(serving, "FASTER_RUNTIME", {"cpu": "onnx"})
    assert resolve_runtime("auto", tmp_path, cpu) == "onnx"
    assert resolve_runtime("auto", tmp_path, cuda) == "torch"  # a device the figures do not name
    assert resolve_runtime("auto", tmp_path / "elsewhere", cpu) == "torch"  # no graph
    # a precision or an attention backend asked for: PyTorch's
    assert resolve_runtime("auto", tmp_path, cpu, torch.bfloat16) == "torch"
    assert resolve_runtime("auto", tmp_path, cpu, attention="eager") == "torch"
    assert resolve_runtime("torch", tmp_path, cpu) == "torch" and resolve_runtime("onnx", tmp_path, cpu) == "onnx"
    with pytest.raises(InputError, match="--runtime tensorrt: use one of auto, torch, onnx"):
        resolve_runtime("tensorrt", tmp_path, cpu)
