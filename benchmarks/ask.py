"""Measurements behind scripts/bench_ask.py: retrieval quality on real text, and speed.

Retrieval quality (how often one, and how often all, of the gold supporting sentences are inside
the passages the reader read): a HotpotQA file's paragraphs, each once, become one long
document (title line, then the sentences, paragraphs separated by blank lines); for each question,
a gold supporting sentence counts as found when its characters lie inside one retrieved passage.
Each retrieval (MiniLM alone, BM25 alone, both fused; with and without the second hop) is measured
at fixed numbers of passages and with the adaptive budget `longdoc ask` uses by default.
"""

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

from longdoc.ask.documents import SourceText
from longdoc.ask.index import index_corpus
from longdoc.ask.retrieve import RetrievalOptions, Retriever, SentenceEvidence


@dataclass
class GoldDocument:
    text: str
    questions: list[str]
    gold: list[list[tuple[int, int]]]  # per question: character spans of its supporting sentences


def hotpotqa_document(path: Path) -> GoldDocument:
    """All paragraphs of a HotpotQA file (each title once) as one text, with gold sentence spans."""
    records = json.loads(Path(path).read_text(encoding="utf-8"))
    parts, spans, position, seen = [], {}, 0, set()
    for record in records:
        for title, sentences in record["context"]:
            if title in seen:
                continue
            seen.add(title)
            offset = position + len(title) + 1
            for index, sentence in enumerate(sentences):
                stripped = sentence.strip()
                if stripped:
                    start = offset + len(sentence) - len(sentence.lstrip())
                    spans[(title, index)] = (start, start + len(stripped))
                offset += len(sentence)
            text = title + "\n" + "".join(sentences)
            parts.append(text)
            position += len(text) + 2
    questions, gold = [], []
    for record in records:
        questions.append(record["question"])
        gold.append([spans[(title, index)] for title, index in record["supporting_facts"] if (title, index) in spans])
    return GoldDocument("\n\n".join(parts), questions, gold)


def write_paragraph_files(path: Path, folder: Path) -> list[str]:
    """Each paragraph of a HotpotQA file (each title once) as its own text file in `folder` (title line,
    then the sentences), numbered in the file's order; the file's questions."""
    records = json.loads(Path(path).read_text(encoding="utf-8"))
    folder.mkdir(parents=True, exist_ok=True)
    seen = set()
    for record in records:
        for title, sentences in record["context"]:
            if title not in seen:
                seen.add(title)
                (folder / f"{len(seen):04d}.txt").write_text(title + "\n" + "".join(sentences) + "\n", encoding="utf-8")
    return [record["question"] for record in records]


def _command_line(work: Path) -> tuple[dict, list[str]]:
    """The environment (a cache of its own under `work`) and the command that run `longdoc` quietly."""
    return {**os.environ, "LONGDOC_CACHE": str(work / "cache")}, [sys.executable, "-m", "longdoc.cli", "--quiet"]


def _seconds(environment: dict, command: list[str], stdin: str = "") -> float:
    """Wall seconds of `command` run to its end (checked) in `environment`, `stdin` on its input."""
    started = time.perf_counter()
    subprocess.run(command, input=stdin, env=environment, check=True, capture_output=True, text=True)
    return time.perf_counter() - started


def corpus_timing_rows(data: Path, work: Path, rounds: int = 3, reader: Path | None = None) -> list[dict]:
    """The command line's times on a HotpotQA file's paragraphs, one file each (`write_paragraph_files`),
    in fresh processes: `longdoc index` on a fresh cache, then in `rounds` alternating rounds `python -c
    "import torch"`, a cached `longdoc ask --question` over every file and over one file, and `longdoc
    ask --json` with every question of the file on standard input and with one (the difference, per
    question, is the time a question takes in one process). Sentence mode; with `reader` (a lifted QA
    reader's folder) also the cached question and a question in one process with `--model reader
    --passages 8`; medians."""
    import statistics

    questions = write_paragraph_files(data, work / "paragraphs")
    (work / "one").mkdir()
    (work / "one" / "0001.txt").write_bytes((work / "paragraphs" / "0001.txt").read_bytes())
    environment, longdoc = _command_line(work)
    seconds = partial(_seconds, environment)

    indexing = seconds(longdoc + ["index", str(work / "paragraphs")])
    seconds(longdoc + ["index", str(work / "one")])
    asked, files = ["--question", questions[0]], len(list((work / "paragraphs").iterdir()))
    steps = {"python -c \"import torch\"": [sys.executable, "-c", "import torch"],
             f"longdoc ask --question (cached, {files} files)":
                 longdoc + ["ask", *asked, str(work / "paragraphs")],
             "longdoc ask --question (cached, 1 file)": longdoc + ["ask", *asked, str(work / "one")]}
    modes = {"": []}
    if reader is not None:
        reading = ["--model", str(reader), "--passages", "8"]
        modes[f" --model {reader.name} --passages 8"] = reading
        step = f"longdoc ask --question --model {reader.name} --passages 8 (cached, {files} files)"
        steps[step] = longdoc + ["ask", *asked, *reading, str(work / "paragraphs")]
        seconds(steps[step])  # untimed: the reader's first question compiles the CPU attention kernels (cached)
    times: dict[str, list[float]] = {step: [] for step in steps}
    per_question: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(rounds):
        for step, command in steps.items():
            times[step].append(seconds(command))
        for mode, options in modes.items():
            asking = longdoc + ["ask", "--json", *options, str(work / "paragraphs")]
            all_questions = seconds(asking, "\n".join(questions) + "\n")
            one_question = seconds(asking, questions[0] + "\n")
            per_question[mode].append((all_questions - one_question) / (len(questions) - 1))
    torch_seconds = statistics.median(times['python -c "import torch"'])
    rows = [{"step": "longdoc index, fresh cache", "seconds": round(indexing, 2), "vs import torch": ""}]
    rows += [{"step": step, "seconds": round(statistics.median(values), 2),
              "vs import torch": round(statistics.median(values) / torch_seconds, 2)} for step, values in times.items()]
    rows += [{"step": f"longdoc ask --json{mode} < {len(questions)} questions: a question in one process",
              "seconds": round(statistics.median(values), 3), "vs import torch": ""}
             for mode, values in per_question.items()]
    return rows


def write_generated_corpus(data: Path, folder: Path, documents: int, words: int = 500, seed: int = 0) -> int:
    """`documents` text files in `folder` of about `words` words each, each a title line and HotpotQA
    sentences (the file `data`'s paragraphs, each title once) drawn at random, seeded by (seed, its
    number) alone: the same files on every run (a file already holding its text is left as it is, so
    that a corpus kept between runs stays indexed). Returns the words of the files."""
    import random

    records = json.loads(Path(data).read_text(encoding="utf-8"))
    pool = sorted({sentence.strip() for record in records for _, sentences in record["context"]
                   for sentence in sentences if sentence.strip()})
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    for number in range(documents):
        rng, chosen, count = random.Random(f"{seed}:{number}"), [], 0
        while count < words:
            chosen.append(rng.choice(pool))
            count += len(chosen[-1].split())
        paragraphs = [" ".join(chosen[start:start + 6]) for start in range(0, len(chosen), 6)]
        text, path = f"Document {number}\n" + "\n\n".join(paragraphs) + "\n", folder / f"{number:05d}.txt"
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        written += count
    return written


def approximate_recall(corpus, vectors, k: int = 8) -> float:
    """Recall@k of the corpus's approximate (HNSW) search against its exact search for the query
    `vectors`: the share of the exact k best that the approximate k hold, a passage scoring as high as
    the exact k-th counting as one of them (equal vectors, as repeated text gives, tie)."""
    import numpy as np

    assert corpus.approximate is not None, "the corpus has no approximate index"
    found = total = 0
    for approximate, exact in zip(corpus.search(vectors, k), corpus.search(vectors, k, exact=True)):
        floor = exact[-1].score - 1e-6
        exact_keys = {(hit.document, hit.passage) for hit in exact}
        found += min(len(exact), sum((hit.document, hit.passage) in exact_keys or hit.score >= floor
                                     for hit in approximate))
        total += len(exact)
    return found / total if total else float(np.nan)


def scale_rows(data: Path, work: Path, documents: int, words: int = 500, rounds: int = 3) -> list[dict]:
    """A generated corpus of `documents` files (`write_generated_corpus`) through the command line, in
    fresh processes: `longdoc index` on a fresh cache (seconds, words a second, peak resident memory
    of the process), then in `rounds` alternating rounds `python -c "import torch"` and a cached
    `longdoc ask --question`, and a question's time in one `ask --json` process (all the HotpotQA
    file's questions against one); then, in this process, the corpus's vector searches for those
    questions: milliseconds a query exact and approximate, and the approximate search's recall@8
    against exact (`approximate_recall`; "-" when the corpus is below APPROXIMATE_FROM passages)."""
    import statistics

    from longdoc.ask.documents import load_sources
    from longdoc.ask.embedding import SentenceEmbedder

    folder = work / "generated"
    fresh = not any((work / "cache" / "ask" / "corpus").glob("*/index.sqlite"))
    written = write_generated_corpus(data, folder, documents, words)
    questions = [record["question"] for record in json.loads(Path(data).read_text(encoding="utf-8"))]
    environment, longdoc = _command_line(work)
    seconds = partial(_seconds, environment)

    started = time.perf_counter()
    indexing = subprocess.Popen(longdoc + ["index", str(folder)], env=environment, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(indexing.pid, 0)
    index_seconds = time.perf_counter() - started
    if status != 0:
        raise RuntimeError(f"longdoc index exited with status {status}")
    asking = longdoc + ["ask", "--question", questions[0], str(folder)]
    torch_times, ask_times, per_question = [], [], []
    for _ in range(rounds):
        torch_times.append(seconds([sys.executable, "-c", "import torch"]))
        ask_times.append(seconds(asking))
        all_questions = seconds(longdoc + ["ask", "--json", str(folder)], "\n".join(questions) + "\n")
        one_question = seconds(longdoc + ["ask", "--json", str(folder)], questions[0] + "\n")
        per_question.append((all_questions - one_question) / (len(questions) - 1))
    embedder = SentenceEmbedder()
    sources, _ = load_sources([folder])
    corpus = index_corpus(sources, embedder, named_by=[str(folder)], cache_root=work / "cache" / "ask",
                          progress=False)
    vectors = embedder.embed(questions)
    search_ms = {}
    for exact in (True, False) if corpus.approximate is not None else (True,):
        corpus.search(vectors[:1], 8, exact=exact)  # the flat index built, the graph touched
        started = time.perf_counter()
        for vector in vectors:
            corpus.search(vector[None], 8, exact=exact)
        search_ms[exact] = 1000 * (time.perf_counter() - started) / len(vectors)
    torch_seconds = statistics.median(torch_times)
    ask_seconds = statistics.median(ask_times)
    name = f"{documents} generated files, {written:,} words, {len(corpus.locations):,} passages"
    indexed = "fresh cache" if fresh else "over the index kept in --work"
    return [{"corpus": name, "step": f"longdoc index, {indexed}", "seconds": round(index_seconds, 1),
             "figure": f"{written / index_seconds:,.0f} words/s, peak {usage.ru_maxrss / 1024:,.0f} MiB resident"},
            {"corpus": name, "step": "python -c \"import torch\"", "seconds": round(torch_seconds, 2), "figure": ""},
            {"corpus": name, "step": "longdoc ask --question (cached)", "seconds": round(ask_seconds, 2),
             "figure": f"{ask_seconds / torch_seconds:.2f}x import torch"},
            {"corpus": name, "step": f"longdoc ask --json < {len(questions)} questions: a question in one process",
             "seconds": round(statistics.median(per_question), 3), "figure": ""},
            {"corpus": name, "step": "vector search, 8 passages, exact", "seconds": round(search_ms[True] / 1000, 4),
             "figure": ""},
            {"corpus": name, "step": "vector search, 8 passages, approximate (HNSW)",
             "seconds": round(search_ms[False] / 1000, 4) if False in search_ms else "-",
             "figure": (f"recall@8 {approximate_recall(corpus, vectors):.4f} of exact"
                        if corpus.approximate is not None else "below the approximate index's size")}]


def covered(span: tuple[int, int], ranges) -> bool:
    """Whether the characters `span` lie inside one of `ranges`."""
    return any(start <= span[0] and span[1] <= end for start, end in ranges)


RETRIEVALS = (("minilm", False), ("minilm", True), ("bm25", True), ("hybrid", True))


def retrieval_quality(document: GoldDocument, embedder, passage_counts=(4, 8, 16),
                      cache_root: Path | None = None) -> list[dict]:
    """Rows {"passages", "retrieval", "second hop", "one", "all", "read", "words"}: per budget (each of
    `passage_counts` fixed, then the default adaptive one) and retrieval, the fraction of the questions
    with one / all gold supporting sentences inside the passages retrieved, and the mean passages and
    words read."""
    text = document.text
    source = SourceText("hotpotqa-paragraphs.txt", text, hashlib.sha256(text.encode()).hexdigest(), False)
    corpus = index_corpus([source], embedder, cache_root=cache_root)
    retriever = Retriever(corpus, embedder, SentenceEvidence(corpus))
    default = RetrievalOptions()
    budgets = [(str(count), {"passages": count, "least": count}) for count in passage_counts]
    budgets.append((f"{default.least}-{default.passages} (adaptive)", {}))
    rows = []
    n = len(document.questions)
    for label, budget in budgets:
        for retrieval, second_hop in RETRIEVALS:
            options = RetrievalOptions(retrieval=retrieval, second_hop=second_hop, **budget)
            one = every = passages = words = 0
            for question, gold in zip(document.questions, document.gold):
                hits = retriever.retrieve(question, retriever.question_vector(question), options)
                ranges = [(corpus.passage(hit).start, corpus.passage(hit).end) for hit in hits]
                found = [covered(span, ranges) for span in gold]
                one += any(found)
                every += all(found)
                passages += len(hits)
                words += sum(len(text[start:end].split()) for start, end in ranges)
            rows.append({"passages": label, "retrieval": retrieval, "second hop": "yes" if second_hop else "no",
                         "one": one / n, "all": every / n, "read": passages / n, "words": words / n})
    return rows


def timed(function, *args, **kwargs):
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - start


def generated_document(words: int, make_examples: Callable, seed: int = 0) -> tuple[str, list[str]]:
    """A long text of generated multi-hop paragraphs (title line + sentences; `make_examples`: the
    built-in generator's) with at least `words` words, and the questions of the examples it is made of."""
    parts, questions, count, index = [], [], 0, 0
    while count < words:
        batch = make_examples(4, seed=seed + index, length=4096, progress=False)
        index += 1
        for record in batch:
            for title, sentences in record["context"]:
                paragraph = title + "\n" + "".join(sentences)
                parts.append(paragraph)
                count += len(paragraph.split())
            questions.append(record["question"])
    return "\n\n".join(parts), questions


def speed_rows(words: int, tasks, reader_task: str, make_examples: Callable, model_dir: Path | None = None,
               questions: int = 5) -> list[dict]:
    """Seconds to index a `words`-word document (fresh cache, then cached) and per answer once
    indexed, through `AskSession` as `longdoc ask` runs it; without `model_dir`, an untrained model of
    `reader_task` (a task of the registry `tasks`) reads."""
    import tempfile

    import torch

    from longdoc.ask.embedding import SentenceEmbedder
    from longdoc.ask.session import AskSession

    text, asked = generated_document(words, make_examples)
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        path = work / "document.txt"
        path.write_text(text, encoding="utf-8")
        if model_dir is None:
            from longdoc.convert.pretrained import default_model_path, default_tokenizer

            torch.manual_seed(0)
            model_dir = work / "untrained"
            tasks.get(reader_task).load("model").from_encoder(default_model_path()).save_pretrained(model_dir)
            default_tokenizer().save_pretrained(model_dir)
        embedder, load_seconds = timed(SentenceEmbedder)
        source = SourceText(str(path), text, hashlib.sha256(text.encode()).hexdigest(), False)
        corpus, index_seconds = timed(index_corpus, [source], embedder, cache_root=work / "cache")
        _, cached_seconds = timed(index_corpus, [source], embedder, cache_root=work / "cache", progress=False)
        document = corpus.documents[0]
        session, session_seconds = timed(AskSession, [source], model_dir, cache_root=work / "cache", progress=False,
                                     tasks=tasks)
        session.ask(asked[0])  # first call: lazy imports and allocator warm-up, not counted
        answer_seconds = [timed(session.ask, question)[1] for question in asked[1:questions + 1]]
    return [
        {"step": f"index {len(text.split())} words ({len(document.passages)} passages), fresh cache",
         "seconds": round(index_seconds, 2)},
        {"step": "same document again, from the cache", "seconds": round(cached_seconds, 2)},
        {"step": "load the sentence model", "seconds": round(load_seconds, 2)},
        {"step": "open a session (reader model + cached index)", "seconds": round(session_seconds, 2)},
        {"step": f"answer a question once indexed (mean of {len(answer_seconds)}, max "
                 f"{max(answer_seconds):.2f})", "seconds": round(sum(answer_seconds) / len(answer_seconds), 2)},
    ]


NO_ANSWER_QUESTIONS = ("Who won the 1998 World Cup?", "What is the boiling point of water?", "Who wrote Hamlet?",
                       "How many legs does a spider have?", "When did the Berlin Wall fall?")


def no_answer_rows(held_out: Callable, write_document: Callable, documents: int = 40, calibration: int = 20,
                   floor: float | None = None) -> list[dict]:
    """The no-answer rule (`longdoc.ask.session`) on the demo's held-out generated documents
    (`held_out(n, tokenizer)` gives their records, `write_document(record, path)` writes one as text),
    each read whole: per question kind (the document's own question, five off-topic ones, the next
    document's question), how many pass the evidence floor, and the lowest and highest evidence, on
    the first `calibration` documents and on the rest."""
    import tempfile

    from longdoc.ask.documents import load_sources
    from longdoc.ask.embedding import SentenceEmbedder
    from longdoc.ask.retrieve import SentenceEvidence
    from longdoc.ask.session import MIN_EVIDENCE

    floor = MIN_EVIDENCE if floor is None else floor
    embedder = SentenceEmbedder()
    records = held_out(documents, embedder.tokenizer)
    scores: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as work:
        for index, record in enumerate(records):
            sources, _ = load_sources([write_document(record, Path(work) / f"document{index}.txt")])
            corpus = index_corpus(sources, embedder, cache_root=Path(work) / "cache", progress=False)
            evidence = SentenceEvidence(corpus)
            every_passage = corpus.search(embedder.embed([record["question"]]), len(corpus.locations))[0]
            part = "calibration" if index < calibration else "held out"
            asked = [("right", record["question"]), *(("off-topic", q) for q in NO_ANSWER_QUESTIONS),
                     ("other person", records[(index + 1) % len(records)]["question"])]
            for kind, question in asked:
                scores.setdefault((part, kind), []).append(
                    evidence.ranked(embedder.embed([question])[0], every_passage)[0][0])
    return [{"documents": part, "questions": kind, "asked": len(values),
             f"evidence >= {floor}": sum(value >= floor for value in values),
             "lowest": round(min(values), 3), "highest": round(max(values), 3)}
            for (part, kind), values in scores.items()]


def sentence_mode_rows(path: Path, cache_root: Path) -> list[dict]:
    """The HotpotQA questions of `path` that are not yes/no, each asked of its own paragraphs written as
    one document (title line, then the sentences; blank lines between paragraphs): how often the first
    answer sentence holds the gold answer (case aside), for `longdoc ask` without a reader (sentence
    mode: retrieval with its second hop, then the nearest sentences of the passages read) and for
    plain MiniLM ranking of every sentence of the document."""
    from longdoc.ask.documents import load_sources
    from longdoc.ask.embedding import SentenceEmbedder
    from longdoc.ask.session import AskSession

    records = [record for record in json.loads(Path(path).read_text(encoding="utf-8"))
               if record["answer"] not in ("yes", "no")]
    embedder = SentenceEmbedder()
    found = {"longdoc ask (sentence mode)": 0, "MiniLM ranking of all sentences": 0}
    for index, record in enumerate(records):
        answer = record["answer"].lower()
        text = "\n\n".join(title + "\n" + "".join(sentences) for title, sentences in record["context"])
        document = cache_root / f"question{index}.txt"
        document.write_text(text, encoding="utf-8")
        sources, _ = load_sources([document])
        session = AskSession(sources, None, progress=False, cache_root=cache_root)
        first = session.ask(record["question"], min_evidence=-1.0)["answers"][0]["text"]
        found["longdoc ask (sentence mode)"] += answer in first.lower()
        sentences = [sentence.strip() for _, paragraph in record["context"] for sentence in paragraph if sentence.strip()]
        nearest = int((embedder.embed(sentences) @ embedder.embed([record["question"]])[0]).argmax())
        found["MiniLM ranking of all sentences"] += answer in sentences[nearest].lower()
    return [{"ranking": name, "questions": len(records), "first sentence holds the answer": round(hits / len(records), 3)}
            for name, hits in found.items()]
