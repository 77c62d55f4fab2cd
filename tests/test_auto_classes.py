"""`import longdoc` registers the encoder with transformers' Auto classes: a saved longdoc folder
loads through AutoModel / AutoConfig in a fresh process, whatever was imported first, and the
import itself loads neither torch nor transformers."""

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from longdoc.model.config import GlobalLocalConfig
from longdoc.model.modeling import GlobalLocalModel
from longdoc.tasks import get_task

pytestmark = pytest.mark.slow  # fresh Python processes that import torch and transformers

# The eager attention path on both sides, so that the outputs compare bit for bit.
ENVIRONMENT = {**os.environ, "LONGDOC_KERNELS": "0"}

LOAD_AND_RUN = """
import sys, torch
from safetensors.torch import load_file, save_file
{preamble}
from transformers import AutoModel
model = AutoModel.from_pretrained(sys.argv[1]).eval()
with torch.no_grad():
    output = model(**load_file(sys.argv[2]))
save_file({{"long": output.long_hidden_state, "global": output.global_hidden_state}}, sys.argv[3])
print(type(model).__module__, type(model).__name__, type(model.config).__name__)
print(any(type(finder).__module__ == "longdoc.auto_classes" for finder in sys.meta_path))
"""


def _python(code, *argv):
    result = subprocess.run([sys.executable, "-c", code, *map(str, argv)], capture_output=True, text=True,
                            timeout=300, env=ENVIRONMENT)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.fixture(scope="module")
def small_config():
    return GlobalLocalConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=64, long_max_len=64, global_max_len=8)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    generator = torch.Generator().manual_seed(1)
    batch = {"long_input_ids": torch.randint(1, 100, (2, 64), generator=generator),
             "global_input_ids": torch.randint(1, 100, (2, 8), generator=generator)}
    path = tmp_path_factory.mktemp("inputs") / "inputs.safetensors"
    save_file(batch, path)
    return path


def _outputs(model, inputs_path, monkeypatch):
    monkeypatch.setenv("LONGDOC_KERNELS", "0")
    with torch.no_grad():
        output = model.eval()(**load_file(inputs_path))
    return output.long_hidden_state, output.global_hidden_state


def test_importing_longdoc_loads_neither_torch_nor_transformers():
    [loaded] = _python("import sys, longdoc; print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    assert loaded == "[]"


@pytest.mark.parametrize("preamble", [
    "import longdoc",  # the README's order
    "import transformers.models.auto.modeling_auto\nimport longdoc",  # transformers' Auto classes first
    "import longdoc\nfrom transformers import BertModel",  # transformers' model code imports AutoModel half-way
    "import longdoc\nimport longdoc.model.modeling",  # so does the encoder's own import
])
def test_auto_model_loads_a_saved_encoder_with_the_same_outputs(small_config, inputs, tmp_path, monkeypatch,
                                                                preamble):
    torch.manual_seed(0)
    model = GlobalLocalModel(small_config)
    model.save_pretrained(tmp_path / "encoder")
    expected = _outputs(model, inputs, monkeypatch)
    printed = _python(LOAD_AND_RUN.format(preamble=preamble), tmp_path / "encoder", inputs, tmp_path / "out.safetensors")
    # A longdoc model, and the finder that waited for transformers is gone once both classes are registered.
    assert printed == ["longdoc.model.modeling GlobalLocalModel GlobalLocalConfig", "False"]
    loaded = load_file(tmp_path / "out.safetensors")
    assert torch.equal(loaded["long"], expected[0]) and torch.equal(loaded["global"], expected[1])


def test_auto_config_alone(small_config, tmp_path):
    small_config.save_pretrained(tmp_path)
    printed = _python("import sys, longdoc\nfrom transformers import AutoConfig\n"
                      "config = AutoConfig.from_pretrained(sys.argv[1])\n"
                      "print(type(config).__name__, config.hidden_size, config.global_max_len)", tmp_path)
    assert printed == ["GlobalLocalConfig 32 8"]


def test_auto_model_on_a_task_folder_gives_its_encoder(small_config, inputs, tmp_path, monkeypatch):
    # As AutoModel on a BertForQuestionAnswering folder gives its BertModel: the encoder's weights,
    # the heads left out.
    torch.manual_seed(0)
    task_model = get_task("wikihop").load("model")(small_config)
    task_model.save_pretrained(tmp_path / "task")
    expected = _outputs(task_model.encoder, inputs, monkeypatch)
    printed = _python(LOAD_AND_RUN.format(preamble="import longdoc"), tmp_path / "task", inputs,
                      tmp_path / "out.safetensors")
    assert printed[0] == "longdoc.model.modeling GlobalLocalModel GlobalLocalConfig"
    loaded = load_file(tmp_path / "out.safetensors")
    assert torch.equal(loaded["long"], expected[0]) and torch.equal(loaded["global"], expected[1])
