"""The README's transcripts rerun, so the README cannot drift from the program.

The convention, read from README.md itself (nothing of its text is copied here):
- a fenced block whose first line starts with `$ ` is a transcript: each `$ ` line is a command (a line
  ending in a backslash continues it on the next), the lines after it, up to the next `$ `, are what
  it printed;
- a ```python block followed at once by a plain fenced block is a snippet and what it printed;
- any other plain fenced block is the output of a command the prose names; it is never rerun here, so
  it must be listed in NOT_RERUN with the reason.

A transcript runs from a folder laid out as a fresh clone is (`../shared/data` beside it, the shipped
`tests/fixtures` inside), after the earlier transcripts that write (with --out) what it reads: the
Predict transcript and the Python snippet read the Train transcript's run. Its stdout must be shown in
full and in order; the stderr lines it shows (warnings, errors) must be among stderr's lines, in
order; progress bars and the other stderr lines may be left out. A command exits non-zero exactly
where the README shows an error line. Only wall-clock times, throughputs and the date a run was scored
are normalised before comparing.
"""

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import run_folder

README = Path(__file__).resolve().parents[1] / "README.md"

# Plain fenced blocks, and transcript commands, that are not rerun, by how their first line starts. The
# Train transcript is rerun although it trains (8 steps at 512 wordpieces): Predict and the Python
# snippet read its run.
NOT_RERUN = {
    "### multihop": "the output of `longdoc demo`, the main job: minutes of training, and the README gives its size",
}

# A manual, not a record: detail lives in docs/, and no output shows the folders of the machine that ran it.
MOST_LINES = 250
MACHINE_PATHS = ("/work/", "/home/", "/root/")

# The run-dependent parts of an output line, each replaced by a placeholder on both sides.
RUN_DEPENDENT = (
    (re.compile(r"\b\d+(?:\.\d+)? s\b"), "<seconds> s"),
    (re.compile(r"\b\d+(?:\.\d+)? examples/s\b"), "<throughput> examples/s"),
    (re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d\b"), "<date>"),
)


@dataclass(frozen=True)
class Command:
    """One command of a transcript: a shell command line, or a Python snippet's code."""

    line: int  # in README.md
    text: str
    shown: tuple[str, ...]
    python: bool = False

    def run(self, cwd: Path) -> subprocess.CompletedProcess:
        environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        argv = [sys.executable, "-c", self.text] if self.python else ["bash", "-c", self.text]
        return subprocess.run(argv, cwd=cwd, env=environment, capture_output=True, text=True, timeout=900)

    def words(self) -> list[str]:
        """The command's words, or a snippet's string literals: among them, every path it reads."""
        if self.python:
            return re.findall(r"\"([^\"]+)\"", self.text)
        return shlex.split(self.text.replace("\\\n", " "))

    def written(self) -> set[str]:
        """The paths it writes with --out."""
        words = [] if self.python else self.words()
        return {following for word, following in zip(words, words[1:]) if word == "--out"}

    def mismatch(self, cwd: Path) -> str | None:
        """Run it in cwd: None where its output and exit status are what the README shows, else how not."""
        finished = self.run(cwd)
        difference = unshown(self.shown, finished.stdout, finished.stderr)
        shows_an_error = any(": error: " in line for line in self.shown)
        if difference is None and (finished.returncode != 0) != shows_an_error:
            difference = f"exit status {finished.returncode}"
        if difference is None:
            return None
        return f"README.md:{self.line}: {self.text}\n{difference}\nstderr's end:\n{finished.stderr[-2000:]}"


@dataclass(frozen=True)
class Transcript:
    line: int
    commands: tuple[Command, ...]

    @property
    def first(self) -> str:
        return self.commands[0].text.splitlines()[0]

    def mismatch(self, cwd: Path) -> str | None:
        """Run its commands in cwd up to the first that does not print what the README shows: how not."""
        return next(filter(None, (command.mismatch(cwd) for command in self.commands)), None)


def fenced_blocks(markdown: str) -> list[tuple[int, str, list[str]]]:
    """(line of the opening fence, its language, the block's lines) for every fenced block."""
    blocks, lines, number = [], markdown.splitlines(), 0
    while number < len(lines):
        if lines[number].startswith("```"):
            language, start = lines[number][3:].strip(), number
            number += 1
            body = []
            while not lines[number].startswith("```"):
                body.append(lines[number])
                number += 1
            blocks.append((start + 1, language, body))
        number += 1
    return blocks


def parse_commands(start: int, body: list[str]) -> list[Command]:
    commands, index = [], 0
    while index < len(body):
        text = body[index][2:]
        line = start + 1 + index
        while text.endswith("\\"):
            index += 1
            text += "\n" + body[index]
        index += 1
        shown = []
        while index < len(body) and not body[index].startswith("$ "):
            shown.append(body[index])
            index += 1
        commands.append(Command(line, text, tuple(shown)))
    return commands


def readme_transcripts() -> tuple[list[Transcript], list[tuple[int, str]]]:
    """The README's transcripts, and the plain blocks that are output only: (line, first line)."""
    transcripts, outputs = [], []
    blocks = fenced_blocks(README.read_text())
    index = 0
    while index < len(blocks):
        line, language, body = blocks[index]
        following = blocks[index + 1] if index + 1 < len(blocks) else None
        if language == "python" and following and following[1] == "" and following[0] == line + len(body) + 2:
            snippet = Command(line + 1, "\n".join(body), tuple(following[2]), python=True)
            transcripts.append(Transcript(line, (snippet,)))
            index += 1
        elif language == "" and body and body[0].startswith("$ "):
            transcripts.append(Transcript(line, tuple(parse_commands(line, body))))
        elif language == "" and body:
            outputs.append((line, body[0]))
        index += 1
    return transcripts, outputs


def not_rerun(first_line: str) -> str | None:
    return next((reason for start, reason in NOT_RERUN.items() if first_line.startswith(start)), None)


TRANSCRIPTS, OUTPUTS = readme_transcripts()
RERUN = [transcript for transcript in TRANSCRIPTS if not_rerun(transcript.first) is None]


def prerequisites(transcript: Transcript) -> list[Transcript]:
    """The earlier transcripts that write what this one (or one of them) reads, in README order."""
    needed, reads = [], {word for command in transcript.commands for word in command.words()}
    for earlier in reversed([t for t in RERUN if t.line < transcript.line]):
        if reads & set().union(*(command.written() for command in earlier.commands)):
            needed.insert(0, earlier)
            reads |= {word for command in earlier.commands for word in command.words()}
    return needed


def normalised(line: str) -> str:
    for pattern, placeholder in RUN_DEPENDENT:
        line = pattern.sub(placeholder, line)
    return line.rstrip()


def unshown(shown: tuple[str, ...], stdout: str, stderr: str) -> str | None:
    """None when the shown lines are stdout's lines, all in order, with some of stderr's lines (in
    order) among them; else what differs."""
    out = [normalised(line) for line in stdout.splitlines()]
    err = [normalised(line) for line in re.split(r"[\r\n]", stderr)]
    out_at = err_at = 0
    for line in map(normalised, shown):
        if out_at < len(out) and line == out[out_at]:
            out_at += 1
        elif line in err[err_at:]:
            err_at = err.index(line, err_at) + 1
        else:
            expected = out[out_at] if out_at < len(out) else "(no more stdout)"
            return f"the README shows\n    {line}\nwhere the program printed, next on stdout,\n    {expected}"
    if out_at < len(out):
        return f"stdout printed lines the README does not show, from\n    {out[out_at]}"
    return None


@pytest.fixture(scope="session")
def clone_folder(shared_data, tmp_path_factory):
    """A function giving, for a chain of transcripts that read each other's files, a folder laid out as
    a fresh clone (../shared/data beside it, the shipped tests/fixtures in it) and the transcripts that
    ran in it (README line -> how its output differed, or None), held locked. pytest-xdist's workers
    share the folders (run_folder), so each transcript runs once in a test run, the Train transcript too, not once more for every later one that reads its run."""

    @contextlib.contextmanager
    def folder(chain: Transcript) -> Iterator[tuple[Path, dict[int, str | None]]]:
        with run_folder(tmp_path_factory, f"readme-{chain.line}") as root:
            clone, ran_file = root / "longdoc", root / "ran"
            if not clone.exists():
                (clone / "tests").mkdir(parents=True)
                (clone / "tests" / "fixtures").symlink_to(Path(__file__).parent / "fixtures", target_is_directory=True)
                (root / "shared").symlink_to(shared_data.parent, target_is_directory=True)
            ran = {int(line): outcome for line, outcome in json.loads(ran_file.read_text()).items()} \
                if ran_file.exists() else {}
            try:
                yield clone, ran
            finally:
                ran_file.write_text(json.dumps(ran))

    return folder


def test_every_output_block_is_rerun_or_excused():
    """A plain block of output that is not a transcript is listed, with its reason, in NOT_RERUN; every
    entry there still matches something in the README."""
    assert RERUN, "no transcript found in the README"
    for line, first in OUTPUTS:
        assert not_rerun(first), f"README.md:{line}: an output block with no `$ ` command; list it in NOT_RERUN"
    firsts = [first for _, first in OUTPUTS] + [transcript.first for transcript in TRANSCRIPTS]
    for start in NOT_RERUN:
        assert any(first.startswith(start) for first in firsts), f"NOT_RERUN names {start!r}, not in the README"


def test_the_readme_is_short_and_shows_no_machine_path():
    lines = README.read_text().splitlines()
    assert len(lines) <= MOST_LINES, f"README.md has {len(lines)} lines, more than {MOST_LINES}: move detail to docs/"
    found = [f"README.md:{number}: {line}" for number, line in enumerate(lines, 1)
             if any(path in line for path in MACHINE_PATHS)]
    assert not found, "a machine's path (show the user's cache as ~/.cache/longdoc):\n" + "\n".join(found)


@pytest.mark.slow
@pytest.mark.parametrize("transcript", RERUN, ids=[f"README.md:{t.line}" for t in RERUN])
def test_transcript_prints_what_the_readme_shows(transcript, clone_folder):
    needed = prerequisites(transcript)
    with clone_folder(needed[0] if needed else transcript) as (clone, ran):
        for step in needed + [transcript]:
            if step.line not in ran:
                ran[step.line] = step.mismatch(clone)
            assert ran[step.line] is None, ran[step.line]
