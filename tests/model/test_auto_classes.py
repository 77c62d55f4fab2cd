"""The model classes register themselves with transformers' Auto classes where they are defined: a saved
longdoc folder loads through AutoModel / AutoConfig in a fresh process that imported the class, in
either order with transformers, while `import longdoc` alone loads neither torch nor transformers and
registers nothing; AutoModel on a task model's folder gives its encoder without a load report;
AutoModelForQuestionAnswering loads a lifted span reader. Weights under the attention's old parameter
names are refused on load, naming `longdoc upgrade`, which renames them once."""

import contextlib
import logging
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoModelForQuestionAnswering, AutoTokenizer, BertForQuestionAnswering
from transformers.modeling_outputs import QuestionAnsweringModelOutput
from transformers.utils import logging as transformers_logging

from longdoc import cli
from longdoc.convert.pretrained import minilm_path
from longdoc.errors import InputError, ModelFolderError
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.pretrained import GlobalLocalModel
from longdoc.model.span_reader import SpanReader
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
"""


def _python(code, *argv):
    result = subprocess.run([sys.executable, "-c", code, *map(str, argv)], capture_output=True, text=True,
                            timeout=300, env=ENVIRONMENT)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


SMALL = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             long_max_len=64, global_max_len=8)


@pytest.fixture(scope="module")
def small_config():
    return GlobalLocalConfig(**SMALL)


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


def _saved_encoder(config, inputs_path, folder, monkeypatch):
    """A seeded encoder saved into `folder`, and its outputs on the inputs."""
    torch.manual_seed(0)
    model = GlobalLocalModel(config)
    model.save_pretrained(folder)
    return _outputs(model, inputs_path, monkeypatch)


def test_importing_longdoc_loads_neither_torch_nor_transformers_and_changes_nothing_in_them():
    [loaded, finders] = _python("import sys; finders = list(sys.meta_path); import longdoc\n"
                                "print(sorted({'torch', 'transformers'} & set(sys.modules)))\n"
                                "print(sys.meta_path == finders)")
    assert (loaded, finders) == ("[]", "True")


@pytest.mark.parametrize("preamble", [
    "from longdoc import GlobalLocalModel",  # the README's order
    "import transformers.models.auto.modeling_auto\nfrom longdoc import GlobalLocalModel",  # Auto classes first
    "from transformers import BertModel\nfrom longdoc.model.pretrained import GlobalLocalModel",  # transformers' first
])
def test_auto_model_loads_a_saved_encoder_with_the_same_outputs(small_config, inputs, tmp_path, monkeypatch,
                                                                preamble):
    expected = _saved_encoder(small_config, inputs, tmp_path / "encoder", monkeypatch)
    printed = _python(LOAD_AND_RUN.format(preamble=preamble), tmp_path / "encoder", inputs, tmp_path / "out.safetensors")
    assert printed == ["longdoc.model.pretrained GlobalLocalModel GlobalLocalConfig"]
    loaded = load_file(tmp_path / "out.safetensors")
    assert torch.equal(loaded["long"], expected[0]) and torch.equal(loaded["global"], expected[1])


def test_auto_config_alone(small_config, tmp_path):
    small_config.save_pretrained(tmp_path)
    printed = _python("import sys\nfrom longdoc import GlobalLocalConfig\nfrom transformers import AutoConfig\n"
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
    printed = _python(LOAD_AND_RUN.format(preamble="from longdoc import GlobalLocalModel"), tmp_path / "task", inputs,
                      tmp_path / "out.safetensors")
    assert printed[0] == "longdoc.model.pretrained GlobalLocalModel GlobalLocalConfig"
    loaded = load_file(tmp_path / "out.safetensors")
    assert torch.equal(loaded["long"], expected[0]) and torch.equal(loaded["global"], expected[1])


@contextlib.contextmanager
def transformers_warnings_shown():
    """transformers' logging at its default level (warnings) with its progress bars off, whatever an
    earlier command in this process set (the command line hides its warnings)."""
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_warning()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(verbosity)


def _load_quietly(auto_class, folder, capfd, caplog):
    """`auto_class.from_pretrained(folder)` and everything it printed or logged (stdout, stderr, logging)."""
    capfd.readouterr()
    caplog.clear()
    with transformers_warnings_shown(), caplog.at_level(logging.WARNING):
        model = auto_class.from_pretrained(folder)
    printed = capfd.readouterr()
    return model, printed.out + printed.err + caplog.text


def test_auto_model_on_a_task_folder_leaves_the_heads_out_without_a_report(small_config, tmp_path, capfd, caplog):
    torch.manual_seed(0)
    task_model = get_task("hotpotqa").load("model")(small_config)
    task_model.save_pretrained(tmp_path / "task")
    encoder, printed = _load_quietly(AutoModel, tmp_path / "task", capfd, caplog)
    assert type(encoder) is GlobalLocalModel
    assert "LOAD REPORT" not in printed and "UNEXPECTED" not in printed, printed
    expected = task_model.encoder.state_dict()
    loaded = encoder.state_dict()
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[name], expected[name]) for name in expected)
    # The heads' keys are left out of the encoder only: the task model loads its own folder with its heads.
    assert task_model._keys_to_ignore_on_load_unexpected == set()


def test_a_key_the_encoder_lacks_inside_its_own_modules_is_still_reported(small_config, tmp_path, capfd, caplog):
    torch.manual_seed(0)
    GlobalLocalModel(small_config).save_pretrained(tmp_path / "encoder")
    weights = load_file(tmp_path / "encoder" / "model.safetensors")
    weights["encoder.layers.7.long_attention_norm.weight"] = torch.ones(small_config.hidden_size)
    save_file(weights, tmp_path / "encoder" / "model.safetensors", metadata={"format": "pt"})
    _, printed = _load_quietly(AutoModel, tmp_path / "encoder", capfd, caplog)
    assert "LOAD REPORT" in printed and "encoder.layers.7.long_attention_norm.weight" in printed, printed


def test_auto_model_for_question_answering_loads_a_lifted_span_reader(tmp_path, monkeypatch, capfd, caplog):
    # Real weights: MiniLM with a fresh qa_outputs head, saved as a Hub QA checkpoint is, then lifted.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    with transformers_warnings_shown():
        source = BertForQuestionAnswering.from_pretrained(minilm_path()).eval()
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    source.save_pretrained(tmp_path / "source")
    tokenizer.save_pretrained(tmp_path / "source")
    monkeypatch.setattr(cli, "COMMANDS", {"lift": "longdoc.commands.lift"})
    assert cli.main(["lift", "--from", str(tmp_path / "source"), "--out", str(tmp_path / "reader")]) == 0

    reader, printed = _load_quietly(AutoModelForQuestionAnswering, tmp_path / "reader", capfd, caplog)
    assert type(reader) is SpanReader and "LOAD REPORT" not in printed, printed
    reader.eval()
    own = SpanReader.from_pretrained(tmp_path / "reader").eval()
    # What a transformers user writes, unchanged: the tokenizer's output in, start/end logits out.
    encoded = AutoTokenizer.from_pretrained(tmp_path / "reader")(
        ["Where was Ada Lovelace born?", "Who wrote of the engine?"],
        ["Ada Lovelace was born in London.", "Ada Lovelace wrote of the engine of Babbage in 1843."],
        padding=True, return_tensors="pt")
    with torch.no_grad():
        output = reader(**encoded)
        expected = own(long_input_ids=encoded["input_ids"], long_attention_mask=encoded["attention_mask"],
                       long_token_type_ids=encoded["token_type_ids"])
        theirs = source(**encoded)
    assert isinstance(output, QuestionAnsweringModelOutput)
    start_logits, end_logits = output.to_tuple()  # no loss without positions: as transformers' models
    assert torch.equal(start_logits, expected.start_logits) and torch.equal(end_logits, expected.end_logits)
    real = encoded["attention_mask"].bool()
    assert not bool(real.all())  # the shorter pair is padded
    for ours, source_logits in ((start_logits, theirs.start_logits), (end_logits, theirs.end_logits)):
        assert (ours - source_logits)[real].abs().max().item() < 1e-4
        assert torch.equal(ours.masked_fill(~real, -1e9).argmax(-1), source_logits.masked_fill(~real, -1e9).argmax(-1))
    # Another task's model is refused by name, not read as a reader.
    torch.manual_seed(0)
    get_task("wikihop").load("model")(GlobalLocalConfig(**SMALL)).save_pretrained(tmp_path / "wikihop")
    with pytest.raises(ModelFolderError, match="is a trained wikihop model, not a span_reader model"):
        AutoModelForQuestionAnswering.from_pretrained(tmp_path / "wikihop")


def test_old_parameter_names_are_refused_on_load_until_upgraded_once(small_config, inputs, tmp_path, monkeypatch,
                                                                    capsys):
    expected = _saved_encoder(small_config, inputs, tmp_path / "encoder", monkeypatch)
    weights_file = tmp_path / "encoder" / "model.safetensors"
    current = load_file(weights_file)
    # The per-softmax parameters as weights written before they had submodules of their own name them.
    old = {key.replace("attention.long_softmax.", "attention.long_").replace("attention.global_softmax.",
                                                                             "attention.global_"): value
           for key, value in current.items()}
    assert old.keys() != current.keys()
    save_file(old, weights_file, metadata={"format": "pt"})
    monkeypatch.setattr(cli, "COMMANDS", {"upgrade": "longdoc.commands.upgrade"})
    with pytest.raises(InputError, match=r"old names .*; run `longdoc upgrade .*encoder` once"):
        GlobalLocalModel.from_pretrained(tmp_path / "encoder")

    assert cli.main(["upgrade", str(tmp_path / "encoder")]) == 0
    assert capsys.readouterr().out == f"{weights_file}: {len(old.keys() - current.keys())} tensors renamed\n"
    upgraded = load_file(weights_file)
    assert upgraded.keys() == current.keys() and all(torch.equal(upgraded[key], current[key]) for key in current)
    loaded = _outputs(GlobalLocalModel.from_pretrained(tmp_path / "encoder"), inputs, monkeypatch)
    assert torch.equal(loaded[0], expected[0]) and torch.equal(loaded[1], expected[1])
    # Once is enough: a second run rewrites nothing.
    assert cli.main(["upgrade", str(tmp_path / "encoder")]) == 0
    assert "nothing rewritten" in capsys.readouterr().out
    # A file, or nothing, where the folder should be: one line each.
    assert cli.main(["upgrade", str(weights_file)]) == 2
    assert capsys.readouterr().err == (f"longdoc upgrade: error: {weights_file}: not a folder; expected a longdoc "
                                       "model folder\n")
    assert cli.main(["upgrade", str(tmp_path / "missing")]) == 2
    assert "missing: no such folder" in capsys.readouterr().err
