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


def _measure(step: str, text: str, queue) -> None:
    from longdoc.cpu_memory import configure_allocator

    configure_allocator()
    import hashlib

    import torch

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
            passages = split_passages(text, embedder.count_tokens)
            texts = [text[p.start:p.end] for p in passages] + [text[start:end] for p in passages
                                                               for start, end in p.sentences]
            order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
            with PeakMemory("cpu") as peak, torch.inference_mode():
                started = time.perf_counter()
                for begin in range(0, len(order), embedder.batch_size):
                    chosen = order[begin:begin + embedder.batch_size]
                    encodings = embedder.batcher.encode_batch([texts[i] for i in chosen])
                    embedder.model(torch.tensor([encoding.ids for encoding in encodings]),
                                   torch.tensor([encoding.attention_mask for encoding in encodings]))
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
