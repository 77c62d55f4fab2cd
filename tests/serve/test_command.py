"""`longdoc serve` as a user runs it: it prints its address and serves until interrupted, binds
loopback unless told otherwise (and warns when told), and refuses bad command lines with one line
and exit status 2."""

import json
import signal
import socket
import subprocess
import sys

import pytest

from tests.serve.conftest import request, wait_ready
from tests.tasks.predictions import prediction_files

PROGRAM = [sys.executable, "-m", "longdoc.cli"]


class Served:
    """`longdoc serve ARGS --port 0` in a child process, its address read from its first line."""

    def __init__(self, *argv):
        self.process = subprocess.Popen([*PROGRAM, "serve", *map(str, argv), "--port", "0"], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        assert line.startswith("longdoc serve: http://"), (line, self.process.stderr.read())
        self.url = line.split()[2].rstrip("/")

    def stop(self) -> tuple[int, str]:
        self.process.send_signal(signal.SIGINT)
        _, stderr = self.process.communicate(timeout=60)
        return self.process.returncode, stderr


def test_prints_its_loopback_address_and_serves_until_interrupted(shared_data, tmp_path):
    gold, preds, _ = prediction_files("wikihop", shared_data, tmp_path)
    served = Served("--task", "wikihop", "--gold", gold, "--pred", preds[0], "--pred", preds[1], "--allow-missing")
    assert served.url.startswith("http://127.0.0.1:")
    status, info = request(f"{served.url}/api/info")
    assert status == 200 and [run["name"] for run in info["runs"]] == [preds[0].name, preds[1].name]
    status, stderr = served.stop()
    assert status == 0 and "warning" not in stderr


def test_another_host_is_warned_about(shared_data, tmp_path):
    gold, preds, _ = prediction_files("wikihop", shared_data, tmp_path)
    served = Served("--task", "wikihop", "--gold", gold, "--pred", preds[0], "--allow-missing", "--host", "0.0.0.0")
    port = served.url.rsplit(":", 1)[1]
    assert request(f"http://127.0.0.1:{port}/api/info")[0] == 200
    _, stderr = served.stop()
    assert "warning: listening on 0.0.0.0, not loopback: the gold and prediction files become readable from the " \
           "network" in stderr


def _fails(*argv) -> str:
    result = subprocess.run([*PROGRAM, "serve", *map(str, argv)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == "" and "Traceback" not in result.stderr
    return result.stderr.strip()


@pytest.mark.slow  # seven processes, each importing torch
def test_bad_command_lines_are_refused_with_one_line(shared_data, tmp_path):
    gold, preds, _ = prediction_files("wikihop", shared_data, tmp_path)
    assert "give documents to ask" in _fails()
    assert "not both" in _fails(tmp_path, "--task", "wikihop", "--gold", gold, "--pred", preds[0])
    assert "--task wikihop needs --gold FILE and --pred FILE" in _fails("--task", "wikihop", "--pred", preds[0])
    assert "--gold, --pred belong to the prediction browser" in _fails(tmp_path, "--gold", gold, "--pred", preds[0])
    assert f"{tmp_path / 'missing.json'}: no such file" in _fails("--task", "wikihop", "--gold", gold, "--pred",
                                                                  tmp_path / "missing.json")
    assert "no readable document to serve" in _fails(tmp_path / "nothing-here.txt", "--port", "0")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert f"cannot listen on 127.0.0.1:{port}" in _fails("--task", "wikihop", "--gold", gold, "--pred", preds[0],
                                                              "--port", port)


@pytest.mark.slow
def test_asks_documents_as_ask_json_does(tmp_path):
    document = tmp_path / "notes.txt"
    document.write_text("Orbix Group sells lamps.\n\nMara Quell was born in Tallinnford. She paints bridges.\n",
                        encoding="utf-8")
    served = Served(document)
    wait_ready(served.url)
    status, answer = request(f"{served.url}/api/ask", {"question": "Where was Mara Quell born?", "top_k": 2})
    printed = subprocess.run([*PROGRAM, "ask", "--json", "--top-k", "2", "--question", "Where was Mara Quell born?",
                              str(document)], capture_output=True, text=True, timeout=300)
    assert status == 200 and answer == json.loads(printed.stdout)
    assert answer["answers"][0]["text"] == "Mara Quell was born in Tallinnford."
    assert served.stop()[0] == 0


def test_a_malformed_scores_file_is_refused_naming_file_and_line(shared_data, tmp_path):
    from longdoc.data.prediction_scores import scores_path, write_scores

    gold, (pred, _), _ = prediction_files("wikihop", shared_data, tmp_path)
    side = write_scores(pred, [{"id": "WH_dev_0", "candidates": [{"text": "germany", "probability": 0.5}]},
                               {"id": "WH_dev_1", "candidates": [{"text": "germany", "probability": 1.5}]}])
    assert side == scores_path(pred)
    message = _fails("--task", "wikihop", "--gold", gold, "--pred", pred, "--allow-missing")
    assert message == (f"longdoc serve: error: {side}:3: example 'WH_dev_1': 'candidates' must be a list of "
                       '{"text": candidate, "probability": a number in [0, 1] or null}')
