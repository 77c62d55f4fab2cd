"""The cpu backend's kernels as torch operators: registered when the backend's module is imported,
not by `import longdoc`, and again without failing when the module is imported again (the
compiled-model tests, outputs and gradients against the eager backend's: tests/model/test_tracing.py)."""

import subprocess
import sys

import pytest

from longdoc.model.kernels import cpu as cpu_kernels

SCRIPT = """
import importlib
import torch
import longdoc

assert not hasattr(torch.ops.longdoc, "cpu_softmax"), "registered by import longdoc"
from longdoc import GlobalLocalModel
from tests.model.conftest import make_inputs, tiny_config

import longdoc.model.backends.cpu as cpu
assert hasattr(torch.ops.longdoc, "cpu_softmax") and hasattr(torch.ops.longdoc, "cpu_softmax_backward")
importlib.reload(cpu)
torch.manual_seed(0)
model = GlobalLocalModel(tiny_config(residual_attention=True))
inputs = make_inputs(2, 13, 4, padding=True, structure=True)
model.set_attention_backend("eager")
expected = model(**inputs).long_hidden_state
model.set_attention_backend("cpu")
torch.testing.assert_close(model(**inputs).long_hidden_state, expected, atol=1e-5, rtol=0)
print("ok")
"""


@pytest.mark.slow
def test_operators_registered_on_the_backends_import_and_again_on_a_second():
    if cpu_kernels.failure() is not None:
        pytest.skip(f"the C++ kernels cannot be built here: {cpu_kernels.failure()}")
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
