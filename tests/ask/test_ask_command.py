"""`longdoc ask` end to end with a tiny (untrained) HotpotQA reader: every answer, support sentence
and passage location is exact in the file's decoded or extracted text (non-ASCII, CRLF, HTML),
questions from a pipe give one JSON line each, and bad input gives one-line errors and exit 2
while the other files are still answered."""

import io
import json
import os
import shutil
import sys

import pytest
import torch

from longdoc.ask.documents import html_to_text
from longdoc.cli import main
from longdoc.convert.pretrained import default_tokenizer
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.pretrained import GlobalLocalModel
from tests.conftest import new_cache
from tests.tasks.conftest import span_answering_model

TEXT = ("Zoë Quellmann works for Brünnhilde Labs.\r\n\r\nThe weather was mild. Café owners were pleased.\r\n\r\n"
        "Brünnhilde Labs is based in Søndervik. It makes kettles.\r\n")
HTML = ("<html><head><title>x</title><script>var a = 1;</script></head><body><h1>Notes &amp; facts</h1>"
        "<p>Åsa Lind works for Orbix Group.</p><p>Orbix Group is based in  Tallinnford.<br>It sells lamps.</p>"
        "</body></html>")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tokenizer = default_tokenizer()
    root = tmp_path_factory.mktemp("reader")
    config = GlobalLocalConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=64, local_radius=16, long_max_len=256,
                               global_max_len=64)
    torch.manual_seed(0)
    GlobalLocalModel(config).save_pretrained(root / "encoder")
    tokenizer.save_pretrained(root / "encoder")
    # untrained, but told to answer with spans: offsets get exercised
    span_answering_model(root / "model", root / "encoder", tokenizer, stride=32, max_question_len=32)
    return root


@pytest.fixture()
def documents(tmp_path, monkeypatch):
    monkeypatch.setenv("LONGDOC_CACHE", str(new_cache(tmp_path / "cache")))
    (tmp_path / "notes.txt").write_bytes(TEXT.encode("utf-8"))
    (tmp_path / "page.html").write_bytes(HTML.encode("utf-8"))
    return tmp_path


def _contents(documents, file):
    text = (documents / file.split("/")[-1]).read_bytes().decode("utf-8")
    return html_to_text(text) if file.endswith(".html") else text


def _check_offsets(documents, result):
    assert result["passages"]
    for passage in result["passages"]:
        assert 0 <= passage["start"] < passage["end"] <= len(_contents(documents, passage["file"]))
    for answer in result["answers"]:
        assert answer["text"] == _contents(documents, answer["file"])[answer["start"]:answer["end"]]
        assert "\n\n" not in answer["text"].replace("\r\n", "\n")  # never across a paragraph break
        assert answer["support"]
        for sentence in answer["support"]:
            assert sentence["text"] == _contents(documents, sentence["file"])[sentence["start"]:sentence["end"]]
    kinds = {d["file"].split("/")[-1]: d["offsets_into"] for d in result["documents"]}
    assert kinds == {"notes.txt": "decoded file text", "page.html": "text extracted from HTML"}


def test_json_answers_and_support_are_exact(model_dir, documents, capsys):
    assert main(["ask", "--model", str(model_dir / "model"), "--question", "Where is the employer of Zoë based?",
                 "--top-k", "5", "--min-score", "0", "--json", str(documents / "notes.txt"),
                 str(documents / "page.html")]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    # stderr names the reader: the one given, read as its task's model
    assert f"longdoc ask: reading with {model_dir / 'model'} (a trained hotpotqa model, runtime torch)\n" in captured.err
    assert result["question"] == "Where is the employer of Zoë based?"
    assert 1 <= len(result["answers"]) <= 5
    _check_offsets(documents, result)
    assert [a["score"] for a in result["answers"]] == sorted((a["score"] for a in result["answers"]), reverse=True)


def test_documents_that_fit_are_read_whole_in_file_order_and_longer_ones_retrieved(model_dir, documents, capsys):
    # Both files fit the reader's 256-wordpiece input: every passage is read (not --passages 1's one),
    # in file order, whatever their retrieval scores.
    question = "Where is the employer of Zoë based?"
    files = [str(documents / "notes.txt"), str(documents / "page.html")]
    assert main(["ask", "--model", str(model_dir / "model"), "--question", question, "--passages", "1",
                 "--min-score", "0", "--json", *files]) == 0
    read = json.loads(capsys.readouterr().out)["passages"]
    assert len(read) > 1 and {passage["file"] for passage in read} == set(files)
    # Twenty copies of the notes do not fit: --passages 1 reads one passage.
    (documents / "long.txt").write_text(TEXT * 20, encoding="utf-8")
    assert main(["ask", "--model", str(model_dir / "model"), "--question", question, "--passages", "1",
                 "--min-score", "0", "--json", str(documents / "long.txt")]) == 0
    assert len(json.loads(capsys.readouterr().out)["passages"]) == 1


def test_questions_from_a_pipe_and_a_bad_file_among_good_ones(model_dir, documents, capsys, monkeypatch):
    (documents / "empty.txt").write_text("", encoding="utf-8")
    monkeypatch.setattr("sys.stdin", io.StringIO("Where is Orbix Group based?\n\nWho works for Orbix Group?\r\n"))
    assert main(["ask", "--model", str(model_dir / "model"), "--min-score", "0", "--json", str(documents),
                 str(documents / "missing.md")]) == 0  # (answered from the others)
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert [json.loads(line)["question"] for line in lines] == ["Where is Orbix Group based?",
                                                                "Who works for Orbix Group?"]
    for line in lines:
        _check_offsets(documents, json.loads(line))
    errors = [line for line in captured.err.splitlines() if line.startswith("longdoc ask: error:")]
    assert errors == [f"longdoc ask: error: {documents / 'empty.txt'}: empty file (no text)",
                      f"longdoc ask: error: {documents / 'missing.md'}: no such file or folder"]
    assert ("longdoc ask: 2 paths could not be read (named above); answering from the 2 files read"  # notes, page
            in captured.err.splitlines())


def test_plain_output_says_no_answer_rather_than_inventing_one(model_dir, documents, capsys):
    # An untrained model's spans are far below the default probability floor.
    assert main(["ask", "--model", str(model_dir / "model"), "--question", "Where is Orbix Group based?",
                 str(documents / "page.html")]) == 0
    assert capsys.readouterr().out.strip() == "no answer found"


def test_plain_output_shows_the_best_supporting_sentences_one_line_each(model_dir, documents, capsys):
    # A model whose supporting-fact threshold is 0 marks every sentence as support.
    everything = documents / "everything"
    shutil.copytree(model_dir / "model", everything)
    config = json.loads((everything / "config.json").read_text())
    config["task_options"]["sp_threshold"] = 0.0
    (everything / "config.json").write_text(json.dumps(config))
    (documents / "five.txt").write_text("Zoë works for Brünnhilde Labs. The weather was mild. Café owners were "
                                        "pleased. Brünnhilde Labs is based in Søndervik. It makes kettles.\n",
                                        encoding="utf-8")
    (documents / "heading.txt").write_text("Report\nZoë works for Brünnhilde Labs. Brünnhilde Labs is based in "
                                           "Søndervik.\n", encoding="utf-8")
    for name, hidden in (("five.txt", 2), ("heading.txt", 0)):
        command = ["ask", "--model", str(everything), "--question", "Where is the employer of Zoë based?",
                   "--min-score", "0", str(documents / name)]
        assert main([*command, "--json"]) == 0
        support = json.loads(capsys.readouterr().out)["answers"][0]["support"]
        assert main(command) == 0
        lines = capsys.readouterr().out.splitlines()
        assert "  (score " in lines[0] and len(lines) == 1 + min(3, len(support)) + (hidden > 0)
        # Each sentence on one line: "Report\nZoë works ..." (a heading and its sentence) too.
        assert [line.split(": ", 1)[1] for line in lines[1:4]] == [" ".join(s["text"].split()) for s in support[:3]]
        if hidden:
            assert lines[4] == f"    ... and {hidden} more supporting sentences (--json lists them all)"
        else:
            assert any(line.endswith(": Report Zoë works for Brünnhilde Labs.") for line in lines[1:])


class _Opened:
    """The paths opened while `counting` (Python's "open" audit event: builtins.open, io.open, os.open)."""

    paths: list[str] | None = None
    hooked = False

    @classmethod
    def counting(cls) -> list[str]:
        if not cls.hooked:  # an audit hook cannot be removed: one, which records only while counting
            sys.addaudithook(lambda event, args: cls.paths.append(str(args[0]))
                             if event == "open" and cls.paths is not None and args[0] is not None else None)
            cls.hooked = True
        cls.paths = []
        return cls.paths


def test_ask_reads_the_model_folders_config_once(model_dir, documents, capsys):
    config = model_dir / "model" / "config.json"
    opened = _Opened.counting()
    try:
        assert main(["ask", "--model", str(model_dir / "model"), "--question", "Where is Brünnhilde Labs based?",
                     "--json", str(documents / "notes.txt")]) == 0
    finally:
        _Opened.paths = None
    assert json.loads(capsys.readouterr().out)["mode"] == "span"
    assert [path for path in opened if os.path.realpath(path) == os.path.realpath(config)] == [str(config)]


def test_a_blank_or_overlong_question_is_refused_at_once_as_the_api_refuses_it(documents, capsys):
    from longdoc.ask.session import MAX_QUESTION_CHARS
    from longdoc.serve.options import AskOptions

    assert main(["ask", "--question", "  ", str(documents / "notes.txt")]) == 2
    assert capsys.readouterr().err == "longdoc ask: error: --question is blank\n"
    long_question = "Where? " * 400
    assert main(["ask", "--question", long_question, str(documents / "notes.txt")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"longdoc ask: error: --question is {len(long_question)} characters long; at most "
                            f"{MAX_QUESTION_CHARS} are read") and error.count("\n") == 1
    for question in ("  ", long_question):  # the same rule over HTTP
        with pytest.raises(ValueError):
            AskOptions(question=question)


def test_a_model_card_that_says_generated_data_is_told_on_stderr(model_dir, documents, capsys):
    reader = documents / "reader"
    shutil.copytree(model_dir / "model", reader)
    arguments = ["ask", "--model", str(reader), "--question", "Where is Brünnhilde Labs based?",
                 str(documents / "notes.txt")]
    assert main(arguments) == 0
    assert "generated data" not in capsys.readouterr().err  # no card
    (reader / "README.md").write_text("# A demo reader\n\nThis model was Trained on Generated documents only.\n")
    assert main(arguments) == 0
    assert ("longdoc ask: note: " + f"{reader}'s model card says it was trained on generated data "
            "('This model was Trained on Generated documents only.')") in capsys.readouterr().err


def test_missing_or_wrong_model_and_nothing_readable(model_dir, documents, capsys):
    assert main(["ask", "--model", str(documents / "nowhere"), "--question", "q", str(documents / "notes.txt")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"longdoc ask: error: {documents / 'nowhere'}: no such folder; --model takes a reader")
    assert error.count("\n") == 1
    assert "longdoc lift --from QA_CHECKPOINT" in error and "without --model, answers are the sentences" in error
    # A file that exists (a weights file, a config.json) is named as a file, not as missing.
    assert main(["ask", "--model", str(model_dir / "model" / "config.json"), "--question", "q",
                 str(documents / "notes.txt")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"longdoc ask: error: {model_dir / 'model' / 'config.json'}: a file, not a model folder; "
                            "--model takes a reader folder") and error.count("\n") == 1
    assert main(["ask", "--model", str(model_dir / "encoder"), "--question", "q", str(documents / "notes.txt")]) == 2
    assert "bare encoder" in capsys.readouterr().err
    damaged = documents / "damaged"
    shutil.copytree(model_dir / "model", damaged)
    (damaged / "model.safetensors").write_bytes((model_dir / "model" / "model.safetensors").read_bytes()[:500])
    assert main(["ask", "--model", str(damaged), "--question", "q", str(documents / "notes.txt")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"longdoc ask: error: {damaged / 'model.safetensors'}: not readable as safetensors (")
    assert error.count("\n") == 1
    (documents / "blob.txt").write_bytes(b"\x00\x01\x02")
    assert main(["ask", "--model", str(model_dir / "model"), "--question", "q", str(documents / "blob.txt")]) == 2
    assert capsys.readouterr().err == (f"longdoc ask: error: {documents / 'blob.txt'}: binary file (contains NUL "
                                       "bytes), not text\n")


def _read_until(leader: int, marker: str, deadline: float) -> str:
    """What the terminal shows until `marker` appears (or the program ends)."""
    import os
    import select
    import time

    seen = ""
    while marker not in seen:
        ready, _, _ = select.select([leader], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"no {marker!r} on the terminal in time; it showed {seen!r}")
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the program closed the terminal
            break
        if not chunk:
            break
        seen += chunk.decode("utf-8", "replace")
    return seen


@pytest.mark.slow
def test_interactive_session_on_a_terminal_has_a_prompt_and_history(model_dir, documents):
    import os
    import pty
    import subprocess
    import sys
    import time

    leader, follower = pty.openpty()
    with open(documents / "stderr.txt", "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "longdoc.cli", "ask", "--model", str(model_dir / "model"), "--min-score", "0",
             "--json", str(documents / "notes.txt")],
            stdin=follower, stdout=follower, stderr=stderr, env={**os.environ, "TERM": "xterm"})
    os.close(follower)
    deadline = time.monotonic() + 600  # a cold start on a loaded 2-core machine
    try:
        _read_until(leader, "question> ", deadline)
        os.write(leader, "Where is Brünnhilde Labs based?\r".encode())
        first = _read_until(leader, "question> ", deadline)
        os.write(leader, b"\x1b[A\r")  # up arrow: readline's history brings the question back
        second = _read_until(leader, "question> ", deadline)
        os.write(leader, b"\x04")  # Ctrl-D leaves
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        os.close(leader)
    for shown in (first, second):
        results = [json.loads(line) for line in shown.split("\r\n") if line.startswith("{")]
        assert [result["question"] for result in results] == ["Where is Brünnhilde Labs based?"]
        assert results[0]["answers"] and results[0]["passages"]
        for answer in results[0]["answers"]:
            assert answer["text"] == TEXT[answer["start"]:answer["end"]]


def _fact_spans(text: str, record: dict) -> list[tuple[int, int]]:
    sentences = {title: sentences for title, sentences in record["context"]}
    spans = []
    for title, index in record["supporting_facts"]:
        fact = sentences[title][index].strip()
        spans.append((text.index(fact), text.index(fact) + len(fact)))
    return spans


@pytest.mark.slow  # generated documents indexed and read, one question each
def test_a_folder_of_txt_md_and_html_reads_both_facts_of_each_question_and_refuses_unrelated_ones(
        model_dir, tmp_path, monkeypatch, capsys):
    # The demo's first three held-out documents (its generator settings, seed 1) as .txt, .md and
    # .html: 2,300 wordpieces, read from retrieved passages. The .md question's answer passage was
    # missed when the second hop's candidates were ranked by cosines across queries.
    from longdoc.demo import write_document
    from longdoc.tasks.multihop.generator import make_examples

    monkeypatch.setenv("LONGDOC_CACHE", str(new_cache(tmp_path / "cache")))
    records = make_examples(3, seed=1, length=768, min_distance=512, comparison_fraction=0.0, relation_share=0.0,
                            chain_order=True, tokenizer=default_tokenizer(), progress=False)
    folder = tmp_path / "reports"
    folder.mkdir()
    write_document(records[0], folder / "a.txt")
    write_document(records[1], folder / "b.md")
    (folder / "c.html").write_text("<html><body>" + "".join(
        f"<h2>{title}</h2><p>{''.join(sentences)}</p>" for title, sentences in records[2]["context"]) + "</body></html>",
        encoding="utf-8")
    contents = {"a.txt": (folder / "a.txt").read_text(encoding="utf-8"),
                "b.md": (folder / "b.md").read_text(encoding="utf-8"),
                "c.html": html_to_text((folder / "c.html").read_text(encoding="utf-8"))}
    unrelated = ["Who won the 1998 World Cup?", "What is the boiling point of water?"]
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(f"{q}\n" for q in [r["question"] for r in records] + unrelated)))
    assert main(["ask", "--model", str(model_dir / "model"), "--min-score", "0", "--json", str(folder)]) == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    both_read = 0
    for record, name, result in zip(records, contents, results):
        read = [(p["start"], p["end"]) for p in result["passages"] if p["file"].endswith(name)]
        assert len(result["passages"]) == 8
        facts_read = [any(s <= start and end <= e for s, e in read)
                      for start, end in _fact_spans(contents[name], record)]
        # The bridge sentence ("A works for B.", the first fact in chain order) is always read: the
        # question is grounded, and answered.
        assert facts_read[0], (name, record["question"])
        assert result["evidence"] >= 0.5 and result["answers"]
        both_read += all(facts_read)
    # The answer's sentence too, for two of the three. Not all: in corpora of three such documents,
    # this untrained sentence model brings both facts for 14 of 24 questions (16 of 24 before the
    # generator levelled its cities); here the third question's company is also named in two
    # filler passages, which outrank its "based in" sentence.
    assert both_read >= 2
    for result in results[3:]:
        # Nothing read speaks of the question: refused, though this reader gives spans at --min-score 0.
        assert result["evidence"] < 0.5 and result["answers"] == []
