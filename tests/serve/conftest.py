"""A real server on a loopback port (uvicorn in a thread, the application `longdoc serve` runs) and a
real browser: Debian's headless Chromium through chromedriver. Without the serve extra or Chromium
the tests skip, saying why; under CI=true (which installs both) they fail instead."""

import asyncio
import json
import os
import shutil
import tempfile
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# Flags for a closed network: without the background-networking ones Chromium tries Google's servers.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage")
WIDE = (1280, 800)
PHONE = (390, 844)


def _missing(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


def require_serve_extra() -> None:
    for module in ("fastapi", "uvicorn"):
        try:
            __import__(module)
        except ImportError:
            _missing(f'the serve extra is not installed ({module}): pip install -e ".[serve]"')


@pytest.fixture(autouse=True)
def _serve_extra():
    require_serve_extra()


@contextmanager
def running(app):
    """`app` served by uvicorn on a free loopback port, in a thread; yields its base URL."""
    import uvicorn

    from longdoc.serve.server import listen

    listener = listen("127.0.0.1", 0)
    # log_config=None: uvicorn's own logging set-up (dictConfig) closes every handler in the process,
    # and absl's handler (imported with rouge-score or TensorBoard by an earlier test) then closes the
    # stream it was made with, pytest's capture of this worker, breaking every test after this one.
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off", log_config=None))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[listener.socket])), daemon=True)
    thread.start()
    try:
        yield listener.url.rstrip("/")
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def request(url: str, body=None, *, method: str | None = None, headers: dict | None = None,
            raw: bytes | None = None) -> tuple[int, dict | str]:
    """(status, parsed JSON or text) of one request; a JSON body when `body` is given."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **(headers or {})} if data is not None else headers or {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method, headers=headers),
                                    timeout=120) as response:
            status, content, kind = response.status, response.read(), response.headers.get("content-type", "")
    except urllib.error.HTTPError as error:
        status, content, kind = error.code, error.read(), error.headers.get("content-type", "")
    return status, json.loads(content) if "json" in kind else content.decode()


def wait_ready(base: str, timeout: float = 300) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, status = request(f"{base}/api/documents")
        if status["state"] in ("ready", "failed"):
            assert status["state"] == "ready", status
            return status
        time.sleep(0.2)
    raise TimeoutError(f"{base} did not finish indexing in {timeout} s")


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium driven by Selenium through Debian's chromedriver (nothing is downloaded)."""
    missing = {package: path for package, path in (("chromium", CHROMIUM), ("chromium-driver", CHROMEDRIVER))
               if not path.exists()}
    if missing:
        _missing(f"{' and '.join(map(str, missing.values()))} not found: apt-get install {' '.join(missing)}")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing("selenium is not installed: pip install -e \".[test]\"")
    profile = tempfile.mkdtemp(prefix="longdoc-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def viewport(driver, size: tuple[int, int]) -> None:
    """The page's viewport exactly `size` CSS pixels (a phone's when narrow, touch and all)."""
    width, height = size
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600})


def overflow(driver) -> int:
    """How many CSS pixels the page is wider than its window (0: nothing overflows horizontally)."""
    return driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth")


def page_errors(driver) -> list[str]:
    """The console's errors since the last call (a failed script, a failed request)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def screenshot(driver, name: str, tmp_path: Path) -> Path:
    """Save a PNG of the page: into $LONGDOC_SCREENSHOTS when set (docs/ takes them from there), else
    into the test's folder."""
    folder = Path(os.environ.get("LONGDOC_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


# The emoji (outside Unicode's BMP) comes before the answers: JavaScript counts it as two units, the
# API as one character, so a page that mixed the two would mark the wrong text.
NOTES = "Notes 🌉 from the archive.\n\nMara Quell was born in Tallinnford. She paints bridges.\n\nOrbix Group sells lamps.\n"


def write_hotpotqa_documents(shared_data: Path, folder: Path, count: int) -> list[dict]:
    """The contexts of the first `count` HotpotQA sample questions as text files (one per question:
    its paragraphs as the HotpotQA reader builds them, blank lines between), and notes.txt; returns
    the sample's records."""
    from longdoc.tasks.hotpotqa.reader import read_examples

    sample = shared_data / "hotpotqa/hotpot_dev_distractor_v1.first53.json"
    folder.mkdir(parents=True, exist_ok=True)
    for number, example in zip(range(count), read_examples(sample)):
        text = "\n\n".join(document.text for document in example.documents)
        (folder / f"hotpotqa-{number:02d}.txt").write_text(text + "\n", encoding="utf-8")
    (folder / "notes.txt").write_text(NOTES, encoding="utf-8")
    return json.loads(sample.read_text(encoding="utf-8"))[:count]


SECRET = "Not to be served: this file lies outside the folder given."


@dataclass(frozen=True)
class ServedDocuments:
    served: list[Path]  # what the server is given: two folders
    asked: list[Path]  # the same documents as `longdoc ask` is given them (the link left out)
    link: Path  # a link inside a served folder to a file outside it: never served
    records: list[dict]  # the HotpotQA records whose contexts the documents hold


@pytest.fixture(scope="session")
def ask_documents(shared_data, tmp_path_factory) -> ServedDocuments:
    root = tmp_path_factory.mktemp("served")
    records = write_hotpotqa_documents(shared_data, root / "docs", 6)
    (root / "more").mkdir()
    (root / "more" / "inside.txt").write_text("The lighthouse keeper of Ostrava Bay was Ilse Marrow.\n",
                                              encoding="utf-8")
    (root / "secret.txt").write_text(SECRET, encoding="utf-8")
    (root / "more" / "link-out.txt").symlink_to(root / "secret.txt")
    return ServedDocuments([root / "docs", root / "more"], [root / "docs", root / "more" / "inside.txt"],
                           root / "more" / "link-out.txt", records)


def held_service(paths):
    """An AskService over `paths` whose indexing waits until the returned event is set."""
    from longdoc.ask.documents import load_sources
    from longdoc.serve.asking import AskService

    gate = threading.Event()

    class HeldService(AskService):
        def _start(self):
            gate.wait(120)
            super()._start()

    sources, _ = load_sources(paths)
    return HeldService(sources, None), gate


@pytest.fixture(scope="session")
def ask_server(ask_documents):
    """The documents served in sentence mode (no reader: the real MiniLM evidence), indexed."""
    require_serve_extra()
    from longdoc.serve.app import create_app
    from longdoc.ask.documents import load_sources
    from longdoc.serve.asking import AskService

    sources, errors = load_sources(ask_documents.served)
    assert [error.path for error in errors] == [str(ask_documents.link)]
    service = AskService(sources, None)
    with running(create_app(asking=service, allowed_hosts=("127.0.0.1", "localhost"))) as base:
        wait_ready(base)
        yield base
    service.close()


@pytest.fixture(scope="session")
def scored_predictions(shared_data, tokenizer, tmp_path_factory) -> dict:
    """{task: (gold, prediction file)} of `longdoc predict` with a tiny random model on the WikiHop
    and OpenKP samples, each prediction file with its scores side file beside it."""
    import warnings

    from tests.tasks.predictions import model_predictions

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # WikiHop's cut supports
        return {task: model_predictions(task, shared_data, tokenizer, tmp_path_factory.mktemp(f"scored-{task}"))
                for task in ("wikihop", "openkp")}
