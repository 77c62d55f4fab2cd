"""Measurements behind scripts/bench_ask.py: retrieval quality on real text, and speed.

Retrieval quality (issue: "how often one, and how often all, of the gold supporting sentences are
inside the passages the reader read"): a HotpotQA file's paragraphs, each once, become one long
document (title line, then the sentences, paragraphs separated by blank lines); for each question,
a gold supporting sentence counts as found when its characters lie inside one retrieved passage.
The baseline retrieves single sentences (the same sentence splitter, the same MiniLM embeddings)
in order of similarity to the question until it holds at least as many words as the passages did,
so it never gets fewer words than we do.
"""

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from longdoc.ask.documents import SourceText
from longdoc.ask.index import CorpusIndex, index_documents
from longdoc.ask.retrieve import retrieve
from longdoc.data.text import split_paragraphs, split_sentences


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


def _covered(span: tuple[int, int], ranges) -> bool:
    return any(start <= span[0] and span[1] <= end for start, end in ranges)


def _words(text: str, ranges) -> int:
    return sum(len(text[start:end].split()) for start, end in ranges)


def retrieval_quality(document: GoldDocument, embedder, passage_counts=(2, 4, 6, 8, 10),
                      cache_root: Path | None = None) -> list[dict]:
    """Rows {"passages", "method", "one", "all", "words"} for our retrieval with and without the
    second hop and for the sentence baseline at the same words; fractions of the questions."""
    text = document.text
    source = SourceText("hotpotqa-paragraphs.txt", text, hashlib.sha256(text.encode()).hexdigest(), False)
    corpus = CorpusIndex(index_documents([source], embedder, cache_root=cache_root))
    sentences = [s for start, end in split_paragraphs(text) for s in split_sentences(text, start, end)]
    sentence_vectors = embedder.embed([text[s:e] for s, e in sentences])
    question_vectors = embedder.embed(document.questions)
    # Sentences in order of similarity to each question (the baseline's ranking).
    sentence_order = np.argsort(-(question_vectors @ sentence_vectors.T), axis=1)
    rows = []
    for count in passage_counts:
        for second_hop in (False, True):
            found_one = found_all = words = baseline_one = baseline_all = baseline_words = 0
            for q, (question, gold) in enumerate(zip(document.questions, document.gold)):
                hits = retrieve(question, corpus, embedder, count, second_hop=second_hop)
                ranges = [(corpus.passage(h).start, corpus.passage(h).end) for h in hits]
                found = [_covered(span, ranges) for span in gold]
                found_one += any(found)
                found_all += all(found)
                budget = _words(text, ranges)
                words += budget
                if second_hop:
                    continue
                taken, taken_words = [], 0
                for i in sentence_order[q]:
                    if taken_words >= budget:
                        break
                    taken.append(sentences[i])
                    taken_words += _words(text, [sentences[i]])
                found = [_covered(span, taken) for span in gold]
                baseline_one += any(found)
                baseline_all += all(found)
                baseline_words += taken_words
            n = len(document.questions)
            rows.append({"passages": count, "method": "MiniLM passages + second hop" if second_hop
                         else "MiniLM passages (question only)", "one": found_one / n, "all": found_all / n,
                         "words": words / n})
            if not second_hop:
                baseline = {"passages": count, "method": "baseline: MiniLM sentences, same words",
                            "one": baseline_one / n, "all": baseline_all / n, "words": baseline_words / n}
        rows.append(baseline)
    top10 = [[sentences[i] for i in order[:10]] for order in sentence_order]
    n = len(document.questions)
    rows.append({"passages": "-", "method": "baseline: MiniLM top 10 sentences",
                 "one": sum(any(_covered(s, t) for s in g) for g, t in zip(document.gold, top10)) / n,
                 "all": sum(all(_covered(s, t) for s in g) for g, t in zip(document.gold, top10)) / n,
                 "words": float(np.mean([_words(text, t) for t in top10]))})
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
        [document], index_seconds = timed(index_documents, [source], embedder, cache_root=work / "cache")
        _, cached_seconds = timed(index_documents, [source], embedder, cache_root=work / "cache", progress=False)
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
            corpus = CorpusIndex(index_documents(sources, embedder, cache_root=Path(work) / "cache", progress=False))
            evidence = SentenceEvidence(corpus, embedder)
            every_passage = corpus.search(embedder.embed([record["question"]]), len(corpus.locations))[0]
            part = "calibration" if index < calibration else "held out"
            asked = [("right", record["question"]), *(("off-topic", q) for q in NO_ANSWER_QUESTIONS),
                     ("other person", records[(index + 1) % len(records)]["question"])]
            for kind, question in asked:
                scores.setdefault((part, kind), []).append(evidence.ranked(question, every_passage)[0][0])
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
