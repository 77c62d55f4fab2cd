"""Indexing throughput of `longdoc ask` beside MiniLM's own forward on the same passages and sentences.

Indexing a document (`longdoc.ask.index.index_corpus`, nothing cached) splits it into passages,
embeds them and each of their sentences with MiniLM (tokenizer, forward, mean pooling,
normalisation), writes the vectors and the BM25 rows of the sentences into the corpus index and puts
the passage vectors in a faiss index. The peer is the floor that embedding sets: MiniLM's tokenizer
and forward alone on the same passage and sentence texts, in the same batches (64, longest first).
Each is measured in a fresh process (the allocator setting of the `longdoc` command, the embedder
loaded and run once on a short text first), for seconds, words per second and peak memory
above what the loaded model held (`longdoc.bench.memory.PeakMemory`). The steps that are ours are
timed apart in the indexing process: the passage split and the BM25 index build.
"""

import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Sequence


def _embedded_texts(text: str, embedder) -> list[str]:
    """What indexing embeds of `text`: its passages and each of their sentences."""
    from longdoc.ask.passages import split_passages

    passages = split_passages(text, embedder.count_tokens)
    return [text[p.start:p.end] for p in passages] + [text[start:end] for p in passages for start, end in p.sentences]


def _forward(embedder, texts: list[str]) -> None:
    """MiniLM's tokenizer and forward alone on `texts`, in the embedder's batches, longest first."""
    import torch

    order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
    with torch.inference_mode():
        for begin in range(0, len(order), embedder.batch_size):
            encodings = embedder.batcher.encode_batch([texts[i] for i in order[begin:begin + embedder.batch_size]])
            embedder.model(torch.tensor([encoding.ids for encoding in encodings]),
                           torch.tensor([encoding.attention_mask for encoding in encodings]))


def alternated_rows(texts: Sequence[str], rounds: int = 3) -> list[dict]:
    """Indexing the documents `texts` (one file each, nothing cached) and MiniLM's tokenizer and
    forward alone on what indexing embeds of them, alternated in one process on one thread, `rounds`
    times: CPU seconds (time.process_time) and wall seconds, medians, and indexing's throughput as a
    share of the forward's (the load of other work falls on both alike)."""
    import hashlib
    import statistics

    import torch

    from longdoc.ask.documents import SourceText
    from longdoc.ask.embedding import SentenceEmbedder
    from longdoc.ask.index import index_corpus

    torch.set_num_threads(1)
    embedder = SentenceEmbedder()
    embedder.embed(["A first short text, so that lazy set-up is not timed."])
    sources = [SourceText(f"document{number}.txt", text, hashlib.sha256(text.encode()).hexdigest(), False)
               for number, text in enumerate(texts)]
    embedded = [piece for text in texts for piece in _embedded_texts(text, embedder)]
    times: dict[str, list[tuple[float, float]]] = {"forward": [], "index": []}
    for _ in range(rounds):
        for step in ("forward", "index"):
            with tempfile.TemporaryDirectory() as cache:
                cpu, wall = time.process_time(), time.perf_counter()
                if step == "forward":
                    _forward(embedder, embedded)
                else:
                    index_corpus(sources, embedder, cache_root=Path(cache), progress=False)
                times[step].append((time.process_time() - cpu, time.perf_counter() - wall))
    words = sum(len(text.split()) for text in texts)
    forward_cpu = statistics.median(cpu for cpu, _ in times["forward"])
    rows = []
    for step, name in (("forward", "MiniLM tokenizer + forward on the passages and sentences"),
                       ("index", f"index_corpus, nothing cached ({len(texts)} files)")):
        cpu = statistics.median(cpu for cpu, _ in times[step])
        rows.append({"step": name, "words": words, "texts embedded": len(embedded), "cpu_seconds": round(cpu, 2),
                     "wall_seconds": round(statistics.median(wall for _, wall in times[step]), 2),
                     "words_per_cpu_second": round(words / cpu), "throughput_vs_forward": round(forward_cpu / cpu, 3)})
    return rows


def _measure(step: str, text: str, queue) -> None:
    from longdoc.cpu_memory import configure_allocator

    configure_allocator()
    import hashlib

    from longdoc.ask.documents import SourceText
    from longdoc.ask.embedding import SentenceEmbedder
    from longdoc.ask.index import index_corpus
    from longdoc.ask.lexical import LexicalIndex
    from longdoc.ask.passages import split_passages
    from longdoc.bench.memory import PeakMemory

    embedder = SentenceEmbedder()
    embedder.embed(["A first short text, so that lazy set-up is not timed."])
    result = {}
    with tempfile.TemporaryDirectory() as cache:
        if step == "forward":
            texts = _embedded_texts(text, embedder)
            with PeakMemory("cpu") as peak:
                started = time.perf_counter()
                _forward(embedder, texts)
                result["seconds"] = time.perf_counter() - started
        else:
            source = SourceText("document.txt", text, hashlib.sha256(text.encode()).hexdigest(), False)
            with PeakMemory("cpu") as peak:
                started = time.perf_counter()
                [document] = index_corpus([source], embedder, cache_root=Path(cache), progress=False).documents
                result["seconds"] = time.perf_counter() - started
            started = time.perf_counter()
            split_passages(text, embedder.count_tokens)
            result["split_seconds"] = time.perf_counter() - started
            started = time.perf_counter()
            LexicalIndex.in_memory(text[start:end] for p in document.passages for start, end in p.sentences)
            result["bm25_seconds"] = time.perf_counter() - started
            started = time.perf_counter()
            index_corpus([source], embedder, cache_root=Path(cache), progress=False)
            result["cached_seconds"] = time.perf_counter() - started
            result["passages"] = len(document.passages)
    result["peak_mib"] = peak.peak_mib
    queue.put(result)


def _in_fresh_process(step: str, text: str) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_measure, args=(step, text, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def indexing_rows(documents: dict[str, str]) -> list[dict]:
    """Per named document text: MiniLM's forward on its passages, then indexing it, each in a fresh
    process; words per second, peak MiB, and the ratio of indexing time to the forward's."""
    rows = []
    for name, text in documents.items():
        words = len(text.split())
        forward = _in_fresh_process("forward", text)
        index = _in_fresh_process("index", text)
        for step, measured in (("MiniLM tokenizer + forward on the passages and sentences", forward),
                               (f"index_corpus, nothing cached ({index['passages']} passages)", index)):
            rows.append({"document": name, "words": words, "step": step, "seconds": round(measured["seconds"], 2),
                         "words_per_second": round(words / measured["seconds"]),
                         "peak_mib": None if measured["peak_mib"] is None else round(measured["peak_mib"]),
                         "vs_forward": round(measured["seconds"] / forward["seconds"], 2)})
        for step, key in (("  of which: passage split", "split_seconds"), ("  of which: BM25 index build", "bm25_seconds"),
                          ("index_corpus, from the cache", "cached_seconds")):
            rows.append({"document": name, "words": words, "step": step, "seconds": round(index[key], 3),
                         "words_per_second": "", "peak_mib": "", "vs_forward": round(index[key] / forward["seconds"], 3)})
    return rows
