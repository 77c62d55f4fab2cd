"""Load test of `longdoc serve`: concurrent clients on loopback, latency and errors, and the answers
held against `longdoc ask --json` for the same questions.

    python scripts/load_test_serve.py [--hotpotqa FILE] [--clients 8] [--requests 200] [--model DIR]

The documents are the contexts of the HotpotQA sample's questions, one text file per question (its
paragraphs: title line, then sentences, as the HotpotQA reader builds them), in a temporary folder; the requests are those questions
with `top_k` 1, 2, 3, 4 in turn, so that 200 requests are 200 different ones. The script starts
`longdoc serve` on 127.0.0.1 (any free port) as a user would, waits for the index, sends one
request to warm up (not counted), then the requests from `--clients` threads at once, each taking
the next request as soon as its last one is answered. It prints p50/p95/max latency, errors (any
status but 200, or no answer), throughput, the CPU and the machine's load; then runs `longdoc ask
--json` once per top_k over the same questions and counts the answers that differ from the
server's (the whole object: answers, scores, offsets, passages), for the first `--compare` of
the different requests (all with `--compare 0`). Exit status 1 on any error or difference.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from itertools import zip_longest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT.parent / "shared" / "data" / "hotpotqa" / "hotpot_dev_distractor_v1.first53.json"
TOP_KS = (1, 2, 3, 4)


def cpu() -> str:
    """The CPU's model name and its widest vector extension, as lscpu reports them."""
    info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("Model name")),
                platform.processor())
    flags = next((line for line in info.splitlines() if line.startswith("Flags")), "")
    vectors = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{name} ({vectors}, {os.cpu_count()} logical CPUs)"


def load() -> str:
    return "load average " + ", ".join(f"{value:.2f}" for value in os.getloadavg())


def write_documents(sample: Path, folder: Path) -> list[str]:
    """One text file per sample question: its paragraphs as the HotpotQA reader builds them (title
    line, then the sentences), blank lines between; the questions."""
    from longdoc.tasks.hotpotqa.reader import read_examples

    examples = list(read_examples(sample))
    for number, example in enumerate(examples):
        text = "\n\n".join(document.text for document in example.documents)
        (folder / f"hotpotqa-{number:02d}.txt").write_text(text + "\n", encoding="utf-8")
    return [example.question for example in examples]


def post(url: str, body: dict) -> tuple[int, dict | None]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, None


def start_server(documents: Path, model: Path | None) -> tuple[subprocess.Popen, str]:
    argv = [sys.executable, "-m", "longdoc.cli", "serve", str(documents), "--host", "127.0.0.1", "--port", "0"]
    if model is not None:
        argv += ["--model", str(model)]
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    line = server.stdout.readline()
    if not line.startswith("longdoc serve: http://127.0.0.1:"):
        server.kill()
        raise SystemExit(f"longdoc serve did not start: {line!r}")
    url = line.split()[2].rstrip("/")
    while True:
        with urllib.request.urlopen(f"{url}/api/documents", timeout=60) as response:
            status = json.loads(response.read())
        if status["state"] == "ready":
            return server, url
        if status["state"] == "failed":
            server.kill()
            raise SystemExit(f"longdoc serve could not start answering: {status['error']}")
        time.sleep(0.5)


def run_load(url: str, requests: list[dict], clients: int) -> tuple[list[float], list[str], dict, float]:
    latencies, errors, answers = [], [], {}
    lock = threading.Lock()

    def one(body: dict) -> None:
        started = time.perf_counter()
        try:
            status, result = post(f"{url}/api/ask", body)
        except OSError as error:
            status, result = f"{type(error).__name__}: {error}", None
        elapsed = time.perf_counter() - started
        with lock:
            latencies.append(elapsed)
            if status != 200 or result is None:
                errors.append(f"{body}: {status}")
            else:
                answers[(body["question"], body["top_k"])] = result

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(one, requests))
    return latencies, errors, answers, time.perf_counter() - started


def cli_answers(documents: Path, questions: list[str], top_k: int, model: Path | None) -> list[dict]:
    argv = [sys.executable, "-m", "longdoc.cli", "ask", "--json", "--quiet", "--top-k", str(top_k), str(documents)]
    if model is not None:
        argv += ["--model", str(model)]
    printed = subprocess.run(argv, input="\n".join(questions) + "\n", capture_output=True, text=True, check=True)
    return [json.loads(line) for line in printed.stdout.splitlines()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hotpotqa", type=Path, default=SAMPLE, help=f"HotpotQA file (default {SAMPLE})")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--requests", type=int, default=200, help="requests sent (default 200)")
    parser.add_argument("--compare", type=int, default=40, metavar="N",
                        help="requests held against `longdoc ask --json` (default 40, a tenth per top_k; 0: all)")
    parser.add_argument("--model", type=Path, help="a reader, as `longdoc serve --model` takes it (default none)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures to FILE")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="longdoc-load-") as folder:
        documents = Path(folder)
        questions = write_documents(args.hotpotqa, documents)
        requests = [{"question": questions[i % len(questions)], "top_k": TOP_KS[(i // len(questions)) % len(TOP_KS)]}
                    for i in range(args.requests)]
        server, url = start_server(documents, args.model)
        try:
            post(f"{url}/api/ask", {"question": "warm-up"})
            before = load()
            latencies, errors, served, seconds = run_load(url, requests, args.clients)
            after = load()
        finally:
            server.terminate()
            server.wait(timeout=60)
        distinct = list(dict.fromkeys((body["question"], body["top_k"]) for body in requests))
        # Each top_k's requests in turn, so that every top_k is compared.
        groups = [[pair for pair in distinct if pair[1] == top_k] for top_k in TOP_KS]
        chosen = [pair for turn in zip_longest(*groups) for pair in turn if pair is not None]
        chosen = chosen[:args.compare] if args.compare else chosen
        differing = []
        for top_k in sorted({top_k for _, top_k in chosen}):
            asked = [question for question, k in chosen if k == top_k]
            for question, printed in zip(asked, cli_answers(documents, asked, top_k, args.model)):
                if served.get((question, top_k)) != printed:
                    differing.append(f"top_k {top_k}: {question}")
        compared = len(chosen)

    ordered = sorted(latencies)
    figures = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "cpu": cpu(),
        "load_before": before, "load_after": after, "clients": args.clients, "requests": len(requests),
        "documents": len(questions), "mode": "span" if args.model else "sentence",
        "p50_s": statistics.median(ordered), "p95_s": ordered[max(0, round(0.95 * len(ordered)) - 1)],
        "max_s": ordered[-1], "mean_s": statistics.fmean(ordered), "requests_per_s": len(requests) / seconds,
        "errors": len(errors), "different_requests": len(distinct), "compared_with_ask_json": compared,
        "differing_from_ask_json": len(differing),
    }
    print(f"longdoc serve load test, {figures['date']}, {figures['cpu']}")
    print(f"{len(requests)} requests ({len(distinct)} different) from {args.clients} concurrent clients on 127.0.0.1, "
          f"{len(questions)} documents, {figures['mode']} mode")
    print(f"latency p50 {figures['p50_s']:.3f} s, p95 {figures['p95_s']:.3f} s, max {figures['max_s']:.3f} s; "
          f"{figures['requests_per_s']:.2f} requests/s; errors {len(errors)}")
    print(f"same as `longdoc ask --json`: {compared - len(differing)} of {compared}")
    print(f"machine load: before {before}; after {after}")
    for line in errors[:10] + differing[:10]:
        print(f"  {line}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 1 if errors or differing else 0


if __name__ == "__main__":
    sys.exit(main())
