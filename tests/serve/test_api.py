"""The ask API of `longdoc serve DOCS` on a real server (sentence mode: the real MiniLM evidence on the
HotpotQA sample's paragraphs): the answers are what `longdoc ask --json` prints, the options reach
the session, bad requests get a JSON error naming the field and the server keeps serving, and no
path leads outside the documents given."""

import argparse
import http.client
import json
import threading
import urllib.parse
from pathlib import Path

import pytest

from longdoc.cli import main
from tests.serve.conftest import SECRET, held_service, request, running, wait_ready

pytestmark = pytest.mark.slow  # the session's server loads MiniLM and indexes the documents once


def _raw(base: str, method: str, path: str, body: bytes = b"", headers: dict | None = None,
         chunks: list[bytes] | None = None) -> tuple[int, dict]:
    """A request sent as written: the path is not normalised ("../" stays), the body may be chunked."""
    address = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    connection.putrequest(method, path, skip_accept_encoding=True, skip_host="Host" in (headers or {}))
    for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
        connection.putheader(name, value)
    if chunks is None:
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
    else:
        connection.putheader("Transfer-Encoding", "chunked")
        connection.endheaders()
        try:
            for chunk in chunks:
                connection.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            connection.send(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered before the body ended
    response = connection.getresponse()
    content = response.read()
    connection.close()
    return response.status, json.loads(content) if "json" in response.getheader("content-type", "") else content


def _cli_answers(paths, question: str, options: list[str], capsys) -> dict:
    capsys.readouterr()
    assert main(["ask", "--json", "--question", question, *options, *map(str, paths)]) == 0
    return json.loads(capsys.readouterr().out)


def test_answers_are_what_ask_json_prints(ask_server, ask_documents, capsys):
    for record in ask_documents.records[:3]:
        status, served = request(f"{ask_server}/api/ask", {"question": record["question"], "top_k": 3, "passages": 4,
                                                           "min_evidence": -1})
        assert status == 200, served
        assert served == _cli_answers(ask_documents.asked, record["question"],
                                      ["--top-k", "3", "--passages", "4", "--min-evidence", "-1"], capsys)
        assert served["mode"] == "sentence" and 1 <= len(served["answers"]) <= 3
        for answer in served["answers"]:
            assert Path(answer["file"]).read_text(encoding="utf-8")[answer["start"]:answer["end"]] == answer["text"]


def test_options_reach_the_session(ask_server, ask_documents):
    question = ask_documents.records[0]["question"]
    ask = lambda **options: request(f"{ask_server}/api/ask", {"question": question, **options})[1]  # noqa: E731
    assert len(ask(passages=2)["passages"]) == 2
    assert len(ask(passages=5, top_k=4)["answers"]) == 4
    refused, open_ = ask(min_evidence=0.99), ask(min_evidence=-1)
    assert refused["answers"] == [] and open_["answers"] and refused["evidence"] == open_["evidence"]
    # Session settings last one question: the next one without them gets the defaults again.
    assert len(ask()["passages"]) > 2


def test_the_api_takes_every_option_of_ask_by_its_long_name():
    from longdoc.commands import ask as ask_command
    from longdoc.serve.options import AskOptions

    parser = argparse.ArgumentParser()
    ask_command.add_arguments(parser)
    # (where and how the reader runs is the server's, set when it starts: `longdoc serve --device ...`;
    # the server runs the PyTorch model, so ask's --runtime has no counterpart; --extract prints a file's text,
    # which GET /api/documents/{file} gives)
    server_options = {"paths", "model", "question", "json", "device", "dtype", "attention", "runtime", "extract"}
    options = set(vars(parser.parse_args(["document.txt"]))) - server_options
    assert set(AskOptions.model_fields) - {"question"} == options
    defaults = vars(parser.parse_args(["document.txt"]))
    assert {name: defaults[name] for name in options} == AskOptions(question="?").model_dump(exclude={"question"})


BIG = b'{"question": "' + b"x" * (1 << 20) + b'"}'


@pytest.mark.parametrize("body, status, field", [
    (b"not json", 400, "body"),
    (b'{"question": ', 400, "body"),
    (b"[1, 2]", 422, "body"),
    (b"{}", 422, "question"),
    (b'{"question": ""}', 422, "question"),
    (b'{"question": "   "}', 422, "question"),
    (json.dumps({"question": "x" * 2001}).encode(), 422, "question"),
    (b'{"question": "who?", "top_k": 0}', 422, "top_k"),
    (b'{"question": "who?", "top_k": "3"}', 422, "top_k"),
    (b'{"question": "who?", "passages": 2.5}', 422, "passages"),
    (b'{"question": "who?", "second_hop": "no"}', 422, "second_hop"),
    (b'{"question": "who?", "topk": 3}', 422, "topk"),
    (BIG, 413, "body"),
])
def test_bad_requests_get_a_json_error_naming_the_field(ask_server, body, status, field):
    got, error = _raw(ask_server, "POST", "/api/ask", body)
    assert (got, error["field"]) == (status, field), error
    assert error["error"].startswith(field) or field == "body"
    assert request(f"{ask_server}/api/ask", {"question": "Who sells lamps?"})[0] == 200  # still serving


def test_a_body_over_one_megabyte_is_refused_while_it_arrives(ask_server):
    status, error = _raw(ask_server, "POST", "/api/ask", chunks=[b'{"question": "', *[b"x" * 65536] * 20, b'"}'])
    assert (status, error["field"]) == (413, "body")
    assert request(f"{ask_server}/api/ask", {"question": "Who sells lamps?"})[0] == 200


def test_unknown_option_lists_the_options(ask_server):
    status, error = request(f"{ask_server}/api/ask", {"question": "who?", "read_everything": True})
    assert status == 422 and error["field"] == "read_everything"
    assert "top_k" in error["error"] and "min_evidence" in error["error"]


def test_documents_are_listed_with_sizes_and_index_state(ask_server, ask_documents):
    status, listing = request(f"{ask_server}/api/documents")
    assert status == 200 and listing["state"] == "ready" and listing["fraction"] == 1.0
    files = [Path(document["file"]) for document in listing["documents"]]
    assert files == sorted(ask_documents.served[0].iterdir()) + [ask_documents.served[1] / "inside.txt"]
    for document, path in zip(listing["documents"], files):
        assert document["bytes"] == path.stat().st_size
        assert document["characters"] == len(path.read_text(encoding="utf-8"))
        assert document["state"] == "indexed" and document["passages"] >= 1


def test_a_document_is_served_under_its_listed_name_only(ask_server, ask_documents):
    listed = request(f"{ask_server}/api/documents")[1]["documents"][0]["file"]
    status, document = request(f"{ask_server}/api/documents/{urllib.parse.quote(listed, safe='')}")
    assert status == 200 and document["text"] == Path(listed).read_text(encoding="utf-8")
    link, secret = str(ask_documents.link), str(ask_documents.link.resolve())
    outside = [
        "/api/documents/../../../../etc/passwd",
        "/api/documents/..%2F..%2F..%2Fetc%2Fpasswd",
        "/api/documents/%2Fetc%2Fpasswd",
        "/api/documents//etc/passwd",
        f"/api/documents/{urllib.parse.quote(secret, safe='')}",
        f"/api/documents/{urllib.parse.quote(link, safe='')}",  # a link in a served folder to a file outside it
        f"/api/documents/{urllib.parse.quote(listed + '/../' + Path(listed).name, safe='')}",
        "/api/documents/%252e%252e%252fetc%252fpasswd",
        "/static/../../../../etc/passwd",
        "/static/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/static/..%2F..%2F..%2F..%2Fetc%2Fpasswd",
    ]
    for path in outside:
        status, body = _raw(ask_server, "GET", path)
        assert status == 404, (path, body)
        assert SECRET not in str(body) and "root:" not in str(body)
    assert all(Path(d["file"]) != ask_documents.link
               for d in request(f"{ask_server}/api/documents")[1]["documents"])


def test_only_loopback_host_names_are_answered(ask_server):
    # A page on another site whose name was rebound to 127.0.0.1 sends that name: refused.
    status, error = _raw(ask_server, "GET", "/api/documents", headers={"Host": "attacker.example:8000"})
    assert (status, error["field"]) == (400, "host")
    assert _raw(ask_server, "GET", "/api/info", headers={"Host": "localhost:8000"})[0] == 200


def test_the_page_and_its_headers(ask_server):
    status, page = request(f"{ask_server}/")
    assert status == 200 and '<label for="question">' in page
    with urllib.request.urlopen(f"{ask_server}/static/style.css") as response:
        policy = response.headers["content-security-policy"]
    assert "default-src 'self'" in policy  # nothing from another machine, whatever a page tries
    for name in ("index.html", "style.css", "common.js", "ask.js", "browse.js", "main.js"):
        text = (Path(__file__).parents[2] / "longdoc/serve/static" / name).read_text(encoding="utf-8")
        assert "http://" not in text and "https://" not in text, name  # no CDN, no outside address


def test_openapi_describes_the_api(ask_server):
    status, schema = request(f"{ask_server}/api/openapi.json")
    assert status == 200
    assert {"/api/ask", "/api/documents", "/api/documents/{file}", "/api/info"} <= set(schema["paths"])
    body = schema["components"]["schemas"]["AskOptions"]
    assert body["required"] == ["question"] and body["properties"]["question"]["maxLength"] == 2000
    assert {"top_k", "passages", "second_hop", "min_evidence"} <= set(body["properties"])


def test_concurrent_questions_are_answered_in_turn_with_the_same_answers(ask_server, ask_documents):
    questions = [record["question"] for record in ask_documents.records]
    alone = {q: request(f"{ask_server}/api/ask", {"question": q, "top_k": 2})[1] for q in questions}
    results, failures = [], []

    def client(number):
        for q in questions[number % 3::3][:3]:
            status, body = request(f"{ask_server}/api/ask", {"question": q, "top_k": 2})
            (results if status == 200 else failures).append((q, body))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [] and len(results) == 16
    assert all(body == alone[q] for q, body in results)


def test_questions_wait_for_the_index_then_are_answered(ask_documents):
    from longdoc.serve.app import create_app

    service, gate = held_service([ask_documents.served[1]])
    with running(create_app(asking=service)) as base:
        status, listing = request(f"{base}/api/documents")
        assert listing["state"] == "indexing" and listing["documents"][0]["state"] == "waiting"
        status, error = request(f"{base}/api/ask", {"question": "Who kept the lighthouse?"})
        assert status == 503 and "indexed" in error["error"]
        gate.set()
        wait_ready(base)
        status, answered = request(f"{base}/api/ask", {"question": "Who kept the lighthouse?"})
        assert status == 200 and "Ilse Marrow" in answered["answers"][0]["text"]
    service.close()


def test_a_reader_that_cannot_load_is_told_by_every_question(ask_documents, tmp_path):
    from longdoc.serve.app import create_app
    from longdoc.ask.documents import load_sources
    from longdoc.serve.asking import AskService

    sources, _ = load_sources([ask_documents.served[1]])
    service = AskService(sources, tmp_path)  # an empty folder: no reader in it
    service.started.result(timeout=120)
    with running(create_app(asking=service)) as base:
        assert request(f"{base}/api/documents")[1]["state"] == "failed"
        status, error = request(f"{base}/api/ask", {"question": "Who kept the lighthouse?"})
        assert status == 503 and str(tmp_path) in error["error"]
    service.close()


def test_serve_loads_minilm_once_and_updates_the_index_once(ask_documents, monkeypatch):
    from longdoc.ask import embedding
    from longdoc.ask.index import CorpusStore
    from longdoc.ask.documents import load_sources
    from longdoc.serve.asking import AskService

    loaded = []

    class CountedEmbedder(embedding.SentenceEmbedder):
        def __init__(self, *args, **kwargs):
            loaded.append(1)
            super().__init__(*args, **kwargs)

    updates, update = [], CorpusStore._update

    def counted_update(*args, **kwargs):
        updates.append(1)
        return update(*args, **kwargs)

    monkeypatch.setattr(embedding, "SentenceEmbedder", CountedEmbedder)
    monkeypatch.setattr(CorpusStore, "_update", counted_update)
    sources, _ = load_sources([ask_documents.served[0]])
    service = AskService(sources, None)
    service.started.result(timeout=120)
    assert service.state == "ready" and len(loaded) == 1 and len(updates) == 1
    answers = service.session.ask("Who kept the lighthouse?")
    assert answers and len(loaded) == 1
    service.close()


def test_an_index_damaged_while_served_is_told_in_one_line_naming_it(ask_documents, tmp_path, monkeypatch):
    from longdoc.ask.documents import load_sources
    from longdoc.serve.app import create_app
    from longdoc.serve.asking import AskService
    from tests.ask.conftest import damage_index

    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path))  # an index of its own to damage
    folder = str(ask_documents.served[0])
    # Indexed by another process, as `longdoc index` does: the server's connection then holds none of the
    # file's pages in its cache, and reads them from the disk when asked.
    assert main(["--quiet", "index", folder]) == 0
    sources, _ = load_sources([folder])
    service = AskService(sources, None, named_by=[folder])
    service.started.result(timeout=300)
    path = service.session.corpus.path
    assert path.is_relative_to(tmp_path)
    damage_index(path)
    with running(create_app(asking=service)) as base:
        status, error = request(f"{base}/api/ask", {"question": ask_documents.records[0]["question"]})
        assert status == 503, error
        assert error["field"] is None and "\n" not in error["error"]
        assert error["error"].startswith(f"{path}: the corpus index was damaged while this session read it (")
        assert error["error"].endswith("; the next longdoc ask, index or serve with these paths rebuilds it")
        assert request(f"{base}/api/documents")[0] == 200  # still serving
    service.close()
