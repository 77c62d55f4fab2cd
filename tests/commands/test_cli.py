"""The `longdoc` program as a user runs it: --version, --help, a closed stdout, output settings."""

import argparse
import contextlib
import io
import json
import re
import subprocess
import sys
from importlib.metadata import version

import pytest

from longdoc import cli

PROGRAM = [sys.executable, "-m", "longdoc.cli"]


def _run(*argv, **kwargs):
    return subprocess.run([*PROGRAM, *argv], capture_output=True, text=True, timeout=120, **kwargs)


def test_version_prints_the_installed_version():
    result = _run("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"longdoc {version('longdoc')}\n"


def test_help_opens_with_what_longdoc_does():
    result = _run("--help")
    assert result.returncode == 0, result.stderr
    description = result.stdout.split("\n\n")[1]
    assert description.startswith("longdoc answers questions over long documents")
    assert "subcommand" not in result.stdout
    listed = re.findall(r"^    (\S+)", result.stdout.split("positional arguments:")[1], flags=re.MULTILINE)
    assert listed[:len(cli.COMMANDS)] == list(cli.COMMANDS)


def test_help_lists_every_document_type_ask_reads():
    from longdoc.ask.documents import SUPPORTED_SUFFIXES

    assert {".pdf", ".docx", ".txt", ".html"} <= set(SUPPORTED_SUFFIXES)
    for argv in (["--help"], ["ask", "--help"]):
        result = _run(*argv)
        assert result.returncode == 0, result.stderr
        words = " ".join(result.stdout.split())  # argparse wraps lines
        assert f"({', '.join(SUPPORTED_SUFFIXES)}, folders)" in words, argv
    assert f"files ({', '.join(SUPPORTED_SUFFIXES)}) and folders" in " ".join(result.stdout.split())


@pytest.fixture(scope="module")
def hotpot_run(shared_data, tmp_path_factory):
    """A run folder `longdoc evaluate --out` wrote (a perfect HotpotQA prediction), for the leaderboard to
    read; made in this process: the tests below are about the leaderboard's process."""
    folder = tmp_path_factory.mktemp("hotpot_run")
    gold = shared_data / "hotpotqa/hotpot_dev_distractor_v1.first53.json"
    examples = json.loads(gold.read_text())
    pred = folder / "pred.json"
    pred.write_text(json.dumps({"answer": {e["_id"]: e["answer"] for e in examples},
                                "sp": {e["_id"]: e["supporting_facts"] for e in examples}}))
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["evaluate", "hotpotqa", "--gold", str(gold), "--pred", str(pred), "--out",
                         str(folder / "run"), "--split", "dev", "--model", "oracle"]) == 0
    return folder / "run"


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["leaderboard", "--json"], ["leaderboard"]])
def test_closed_stdout_ends_quietly(hotpot_run, argv):
    process = subprocess.Popen([*PROGRAM, *argv, str(hotpot_run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # The reader goes away before the program writes (it is still importing): every write fails.
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == cli.BROKEN_PIPE_STATUS
    assert stderr == ""


def test_broken_pipe_from_any_command_is_caught(monkeypatch, capsys):
    # main() wraps whichever command's run() it calls; the subprocess test above closes a real pipe.
    def run_into_closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    class Parser:
        def parse_args(self, argv):
            return argparse.Namespace(command=argv[0], quiet=False, verbose=False, run=run_into_closed_pipe)

    monkeypatch.setattr(cli, "build_parser", Parser)
    monkeypatch.setattr(cli, "_silence_closed_stdout", lambda: None)  # pytest's captured stdout stays
    monkeypatch.setattr(cli, "_configure_output", lambda args: None)
    for command in cli.COMMANDS:
        assert cli.main([command]) == cli.BROKEN_PIPE_STATUS
    assert capsys.readouterr() == ("", "")


@pytest.fixture
def transformers_output_restored():
    from transformers.utils import logging as transformers_logging

    verbosity, bars = transformers_logging.get_verbosity(), transformers_logging.is_progress_bar_enabled()
    yield transformers_logging
    transformers_logging.set_verbosity(verbosity)
    (transformers_logging.enable_progress_bar if bars else transformers_logging.disable_progress_bar)()


@pytest.mark.parametrize("flags, level, bars", [([], "ERROR", False), (["--quiet"], "ERROR", False),
                                                (["--verbose"], "INFO", True)])
def test_transformers_output_is_set_by_the_program(transformers_output_restored, monkeypatch, flags, level, bars):
    import logging

    monkeypatch.setattr(cli.warnings, "simplefilter", lambda *args: None)  # --quiet's filter stays in this test
    args = cli.build_parser().parse_args([*flags, "leaderboard", "somewhere"])
    cli._configure_output(argparse.Namespace(**{**vars(args), "command": "ask"}))
    assert transformers_output_restored.get_verbosity() == getattr(logging, level)
    assert transformers_output_restored.is_progress_bar_enabled() is bars


def test_importing_longdoc_leaves_transformers_output_alone():
    # The settings belong to the program: a library import changes nothing.
    code = ("from transformers.utils import logging as l; before = (l.get_verbosity(), l.is_progress_bar_enabled()); "
            "import longdoc, longdoc.cli; assert (l.get_verbosity(), l.is_progress_bar_enabled()) == before, before")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_quiet_hides_longdoc_warnings(shared_data, tmp_path):
    gold = shared_data / "wikihop/wikihop_dev.first28.json"
    examples = json.loads(gold.read_text())
    pred = tmp_path / "pred.json"
    pred.write_text(json.dumps({e["id"]: e["answer"] for e in examples[:20]}))
    argv = ["evaluate", "wikihop", "--gold", str(gold), "--pred", str(pred), "--json", "--allow-missing"]
    loud, quiet = _run(*argv), _run("--quiet", *argv)
    assert loud.returncode == quiet.returncode == 0
    assert loud.stderr.startswith("longdoc: warning: wikihop: 8 of 28 gold questions have no prediction")
    assert quiet.stderr == "" and quiet.stdout == loud.stdout


def test_train_task_help_lists_the_shared_options_and_that_tasks_own(capsys):
    from longdoc.commands.task_flags import flags_by_task
    from longdoc.data.options import flag_of

    by_task = flags_by_task(lambda task: task.train_options)
    for task in ("wikihop", "nq"):
        with pytest.raises(SystemExit) as stop:
            cli.main(["train", task, "--help"])
        assert stop.value.code == 0
        printed = capsys.readouterr().out
        assert "--max-steps" in printed and "--train FILE" in printed  # shared
        for name, (_, tasks) in by_task.items():
            assert (f"{flag_of(name)} " in printed) == (task in tasks), (task, name)
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])  # before TASK: every task's
    printed = capsys.readouterr().out
    assert all(f"{flag_of(name)} " in printed for name in by_task)
