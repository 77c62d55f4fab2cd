"""What a user types wrong, or stops, on the command line: a misspelled flag (the command's usage and the
nearest flag), a missing file, a port no socket has, a folder --out does not have, Ctrl-C (exit 130, one
line, nothing half-written), and a model whose outputs are not numbers (refused, nothing written)."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from longdoc import cli
from longdoc.cli import main
from longdoc.model.config import GlobalLocalConfig
from longdoc.tasks import get_task
from tests.conftest import new_cache

# 512 long tokens: the export's check runs the model at its longest input (4096 by default), which is no
# part of what these tests stop or refuse.
TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, local_radius=8,
            max_relative_distance=4, relative_vocab_size=16, long_max_len=512, global_max_len=128)
WIKIHOP_DEV = "wikihop/wikihop_dev.first28.json"


def _refused(capsys, argv) -> str:
    """stderr of an argv argparse refuses (exit status 2)."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, usage, hint", [
    (["ask", "--qestion", "who?", "notes.txt"], "usage: longdoc ask ", "did you mean --question?"),
    (["train", "hotpotqa", "--lrr", "3"], "usage: longdoc train ", "did you mean --lr?"),
    (["evaluate", "wikihop", "--gold", "g", "--pred", "p", "--jsn"], "usage: longdoc evaluate ", "did you mean --json?"),
    (["evaluate", "wikihop", "--gold", "g", "--pred", "p", "stray"], "usage: longdoc evaluate ", "arguments: stray"),
])
def test_an_unknown_argument_shows_the_commands_usage_and_the_nearest_flag(capsys, argv, usage, hint):
    error = _refused(capsys, argv)
    assert error.startswith(usage), error
    assert error.rstrip().endswith(hint), error
    assert error.rstrip().splitlines()[-1].startswith(f"longdoc {argv[0]}: error: unrecognized arguments: ")


def test_a_missing_file_is_named_as_every_command_names_it(tmp_path, capsys):
    gold = tmp_path / "nope.json"
    assert main(["evaluate", "hotpotqa", "--gold", str(gold), "--pred", str(gold)]) == 2
    assert capsys.readouterr().err == f"longdoc evaluate: error: {gold}: no such file or folder\n"


@pytest.mark.parametrize("port, message", [("99999", "99999 is outside 1-65535 (0: any free port)"),
                                           ("-1", "-1 is outside 1-65535 (0: any free port)"),
                                           ("http", "not a port number: 'http'")])
def test_serve_refuses_a_port_no_socket_has(capsys, port, message):
    error = _refused(capsys, ["serve", "notes.txt", "--port", port])
    assert error.rstrip().splitlines()[-1] == f"longdoc serve: error: argument --port: {message}"


def test_report_to_none_is_no_logging_tool():
    from longdoc.train.options import TrainingOptions

    assert TrainingOptions(train="train.json", out="run", report_to="none").report_to is None


@pytest.fixture(scope="module")
def wikihop_model(tokenizer, tmp_path_factory) -> Path:
    """A tiny random WikiHop model, saved as `longdoc train` saves one."""
    from longdoc.model_folder import save_model

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("wikihop") / "model"
    folder.mkdir()
    save_model(folder, get_task("wikihop").load("model")(GlobalLocalConfig(vocab_size=tokenizer.vocab_size, **TINY)),
               tokenizer)
    return folder


def _predict(model: Path, data: Path, out: Path) -> list[str]:
    return ["--quiet", "predict", "wikihop", "--model", str(model), "--data", str(data), "--out", str(out)]


def test_predict_refuses_an_out_folder_that_does_not_exist(wikihop_model, shared_data, tmp_path, capsys):
    out = tmp_path / "missing" / "pred.json"
    assert main(_predict(wikihop_model, shared_data / WIKIHOP_DEV, out)) == 2
    assert capsys.readouterr().err == f"longdoc predict: error: --out {out}: no such folder {out.parent}; create it first\n"
    assert not out.parent.exists()


def test_outputs_that_are_not_numbers_are_refused_naming_the_example(wikihop_model, shared_data, tmp_path, tokenizer,
                                                                    capsys):
    """Finite weights so large that the candidate logits overflow: predict names the first example,
    exits 2 and writes nothing (no NaN in a JSON file)."""
    from longdoc.model_folder import save_model

    model = get_task("wikihop").load("model").from_pretrained(wikihop_model)
    with torch.no_grad():
        model.candidate_head.projection.weight.fill_(3e38)
    folder = tmp_path / "overflowing"
    folder.mkdir()
    save_model(folder, model, tokenizer)
    out = tmp_path / "pred.json"
    assert main(_predict(folder, shared_data / WIKIHOP_DEV, out)) == 2
    first = json.loads((shared_data / WIKIHOP_DEV).read_text(encoding="utf-8"))[0]["id"]
    # The last line: a first run notes before it that it compiles the attention kernels.
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"longdoc predict: error: example {first!r}: the model's candidate_logits hold NaN or +infinity; its weights "
        "are damaged, or the training run that saved it diverged")
    assert list(tmp_path.glob("pred*")) == []


def test_ctrl_c_in_any_command_is_one_line_and_status_130(monkeypatch, capsys):
    # main() wraps whichever command's run() it calls; the subprocess tests below send a real SIGINT.
    def interrupted(args):
        raise KeyboardInterrupt

    class Parser:
        def parse_args(self, argv):
            return argparse.Namespace(command=argv[0], quiet=False, verbose=False, run=interrupted)

    monkeypatch.setattr(cli, "build_parser", Parser)
    monkeypatch.setattr(cli, "_configure_output", lambda args: None)
    for command in cli.COMMANDS:
        assert cli.main([command]) == cli.INTERRUPTED_STATUS
        kept = cli.KEPT_WHEN_INTERRUPTED.get(command)
        assert capsys.readouterr() == ("", f"longdoc {command}: interrupted" + (f"; {kept}" if kept else "") + "\n")


# The program, with MODULE:NAME (or MODULE:CLASS.NAME) replaced by a function that, on its CALL-th call,
# sends this process SIGINT (as Ctrl-C does), and otherwise goes on as the real one: the interrupt lands
# inside the command's work.
INTERRUPTED_AT = """
import importlib, signal, sys
module, path = sys.argv[1].split(":")
call = int(sys.argv[2])
owner = importlib.import_module(module)
*classes, name = path.split(".")
for class_name in classes:
    owner = getattr(owner, class_name)
real = getattr(owner, name)
calls = 0
def interrupting(*args, **kwargs):
    global calls
    calls += 1
    if calls == call:
        signal.raise_signal(signal.SIGINT)
    return real(*args, **kwargs)
setattr(owner, name, interrupting)
from longdoc.cli import main
sys.exit(main(sys.argv[3:]))
"""


def _interrupted_at(target: str, argv: list[str], call: int = 1, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", INTERRUPTED_AT, target, str(call), *argv], capture_output=True,
                          text=True, timeout=600, **kwargs)


@pytest.mark.slow
def test_ctrl_c_during_predict_writes_nothing(wikihop_model, shared_data, tmp_path):
    out = tmp_path / "pred.json"
    result = _interrupted_at("longdoc.model.task_model:TaskModel.forward_rows",
                             _predict(wikihop_model, shared_data / WIKIHOP_DEV, out))
    assert result.returncode == 130, result.stderr
    assert result.stderr.splitlines()[-1] == "longdoc predict: interrupted; nothing written"
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_ctrl_c_during_export_leaves_no_folder(tokenizer, tmp_path_factory, tmp_path):
    # A span reader of the tiny encoder: the export is stopped as it saves the graph, after tracing it, and a
    # span reader's graph (no global tokens) traces in half the time of a task model's.
    from longdoc.model.span_reader import SpanReader
    from longdoc.model_folder import save_model

    pytest.importorskip("onnx")
    torch.manual_seed(0)
    model = tmp_path_factory.mktemp("span_reader") / "model"
    model.mkdir()
    save_model(model, SpanReader(GlobalLocalConfig(vocab_size=tokenizer.vocab_size, **TINY)), tokenizer)
    out = tmp_path / "exported"
    result = _interrupted_at("onnx:save_model", ["--quiet", "export", "--model", str(model), "--out", str(out)])
    assert result.returncode == 130, result.stderr
    assert result.stderr.splitlines()[-1] == "longdoc export: interrupted; nothing written"
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_ctrl_c_while_ask_indexes_keeps_the_documents_indexed_so_far(tmp_path, monkeypatch):
    """Two documents indexed, a third added, and ask stopped while saving it: the two stay in the
    corpus index, and the next run indexes only the third."""
    import os
    import sqlite3

    from longdoc.model.cache import ENVIRONMENT_VARIABLE

    cache = new_cache(tmp_path / "cache")
    documents = tmp_path / "docs"
    documents.mkdir()
    for number, text in enumerate(["Mara Quell paints bridges.", "Orbix Group sells lamps."]):
        (documents / f"{number}.txt").write_text(text + "\n", encoding="utf-8")
    environment = {**os.environ, ENVIRONMENT_VARIABLE: str(cache)}
    argv = ["--quiet", "ask", "--question", "Who paints bridges?", str(documents)]
    # The runs before and after the interrupted one, in this process: only that one is stopped by a signal.
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, str(cache))
    assert main(argv) == 0

    def indexed() -> int:
        [index] = cache.glob("ask/corpus/*/index.sqlite")
        with sqlite3.connect(index) as connection:
            return connection.execute("SELECT count(*) FROM documents").fetchone()[0]

    (documents / "2.txt").write_text("Ilse keeps a lighthouse.\n", encoding="utf-8")
    result = _interrupted_at("longdoc.ask.index:_save", argv, call=1, env=environment)
    assert result.returncode == 130, result.stderr
    assert result.stderr.splitlines()[-1] == ("longdoc ask: interrupted; the documents indexed so far are kept in the "
                                              "index cache; asking again starts from them")
    assert "Traceback" not in result.stderr
    assert indexed() == 2
    assert main(argv) == 0
    assert indexed() == 3
