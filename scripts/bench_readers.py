"""A Hub-style extractive QA reader through `longdoc ask`, against the standard sliding-window reader.

  python scripts/bench_readers.py reader --out DIR [--train-examples 2000]
      fine-tunes the packaged MiniLM as transformers' BertForQuestionAnswering (its own model and
      loss) on short generated contexts ("P was born in C." -> "Where was P born?"), saves it as a
      Hub reader is saved (DIR/qa-reader) and lifts it with `longdoc lift` (DIR/lifted).
  python scripts/bench_readers.py short --out DIR [--documents 100]
      short documents (about 150 words, 3 same-relation distractors): how often `longdoc ask`'s
      answer equals the peer's, and each one's exact match.
  python scripts/bench_readers.py long --out DIR [--relations born moved --documents 3 --questions 4
                                                  --words 20000]
      per relation, documents of 20,000 words with 40 same-relation distractors, facts at random
      depths, questions about facts drawn from each: exact match and seconds per question of
      `longdoc ask` with hybrid retrieval (its default), with MiniLM alone and with BM25 alone,
      `longdoc ask --read-all`, and the peer, all on the same questions in one process; for the
      retrieving settings, how often the passages read hold the sentence stating the asked fact
      (gold passage recall) and how many were read. Each document is indexed once (its time
      reported apart); each question is asked once per setting, each setting in its own session.

The peer (benchmarks.readers.SlidingWindowReader) reads every window of 384 wordpieces (stride
128) and takes the best start + end logit over all windows, answers of at most 15 wordpieces, as
transformers' run_qa post-processing and its former question-answering pipeline did. Each command
prints a markdown table and, with --json FILE, writes its rows.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's benchmarks/ package


def _fact_documents(count: int, *, seed: int, words: int, distractors: int, relation: str = "born"):
    from benchmarks.readers import make_fact_questions

    return make_fact_questions(count, seed=seed, words=words, distractors=distractors, relation=relation)


def reader(args) -> list[dict]:
    from benchmarks.readers import finetune_qa_reader
    from longdoc.convert.pretrained import minilm_path

    out = Path(args.out)
    examples = _fact_documents(args.train_examples, seed=args.seed, words=70, distractors=3)
    started = time.perf_counter()
    finetune_qa_reader(minilm_path(), examples, out / "qa-reader", epochs=args.epochs)
    seconds = time.perf_counter() - started
    subprocess.run(["longdoc", "lift", "--from", str(out / "qa-reader"), "--out", str(out / "lifted")], check=True)
    return [{"step": "fine-tune BertForQuestionAnswering", "examples": len(examples), "seconds": round(seconds, 1)}]


class LongdocReader:
    """`longdoc ask --model LIFTED` on one document, in process: the index built once per document."""

    def __init__(self, model_dir: Path, cache_root: Path):
        self.model_dir, self.cache_root = model_dir, cache_root

    def open(self, context: str, folder: Path):
        from longdoc.ask.documents import load_sources
        from longdoc.ask.session import AskSession
        from longdoc.model_folder import read_model_folder

        path = folder / "document.txt"
        path.write_text(context, encoding="utf-8")
        sources, errors = load_sources([path])
        assert not errors, errors
        return AskSession(sources, read_model_folder(self.model_dir), progress=False, cache_root=self.cache_root)

    @staticmethod
    def answer(session, question: str, **options) -> tuple[str, dict]:
        result = session.ask(question, **options)
        return (result["answers"][0]["text"] if result["answers"] else ""), result


def short(args) -> list[dict]:
    from benchmarks.readers import SlidingWindowReader

    out = Path(args.out)
    peer = SlidingWindowReader(out / "qa-reader")
    documents = _fact_documents(args.documents, seed=args.seed + 1, words=150, distractors=3)
    ours = LongdocReader(out / "lifted", Path(tempfile.mkdtemp()))
    agree = ours_right = peer_right = 0
    with tempfile.TemporaryDirectory() as folder:
        for document in documents:
            session = ours.open(document.context, Path(folder))
            mine, _ = ours.answer(session, document.question)
            theirs = peer.answer(document.question, document.context).text
            agree += mine == theirs
            ours_right += mine == document.answer
            peer_right += theirs == document.answer
    n = len(documents)
    return [{"documents": n, "words": 150, "agreement": round(agree / n, 3),
             "longdoc_em": round(ours_right / n, 3), "peer_em": round(peer_right / n, 3)}]


ASK_SETTINGS = {"ask (hybrid)": {}, "ask (minilm)": {"retrieval": "minilm"}, "ask (bm25)": {"retrieval": "bm25"},
                "ask --read-all": {"read_all": True}}


def long(args) -> list[dict]:
    import hashlib
    import random

    from longdoc.ask.documents import SourceText
    from longdoc.ask.embedding import SentenceEmbedder
    from longdoc.ask.index import index_corpus
    from benchmarks.readers import RELATIONS, SlidingWindowReader

    out = Path(args.out)
    peer = SlidingWindowReader(out / "qa-reader")
    ours = LongdocReader(out / "lifted", Path(tempfile.mkdtemp()))
    embedder = SentenceEmbedder()
    rows = []
    for relation in args.relations:
        documents = _fact_documents(args.documents, seed=args.seed + 2, words=args.words, distractors=40,
                                    relation=relation)
        tally = {name: {"right": 0, "seconds": 0.0, "recalled": 0, "read": 0} for name in [*ASK_SETTINGS, "peer"]}
        index_seconds, asked, words = 0.0, 0, 0
        with tempfile.TemporaryDirectory() as folder:
            for number, document in enumerate(documents):
                words += len(document.context.split())
                rng = random.Random(f"{args.seed}:{relation}:{number}")
                chosen = rng.sample(range(len(document.facts)), min(args.questions, len(document.facts)))
                text = document.context
                source = SourceText(str(Path(folder) / "document.txt"), text, hashlib.sha256(text.encode()).hexdigest(),
                                    False)  # the file ours.open writes: the session finds this index
                started = time.perf_counter()  # nothing cached yet: split, embed, both indexes
                index_corpus([source], embedder, cache_root=ours.cache_root, progress=False)
                index_seconds += time.perf_counter() - started
                # One session per setting: each keeps the sentence vectors of what it read, as a user's does.
                sessions = {name: ours.open(text, Path(folder)) for name in ASK_SETTINGS}
                # Not counted: lazy imports, first allocations, the reader's first call (the question is
                # read whatever its evidence, so that the reader runs) and --read-all's sentence vectors.
                for name, session in sessions.items():
                    ours.answer(session, "Where is it?", min_evidence=-1.0, **ASK_SETTINGS[name])
                for fact in chosen:
                    person, city = document.facts[fact]
                    question = rng.choice(RELATIONS[relation].questions).format(person=person)
                    start, end = document.statement_span(fact)
                    for name, options in ASK_SETTINGS.items():
                        started = time.perf_counter()
                        answer, result = ours.answer(sessions[name], question, **options)
                        tally[name]["seconds"] += time.perf_counter() - started
                        tally[name]["right"] += answer == city
                        tally[name]["read"] += len(result["passages"])
                        tally[name]["recalled"] += any(p["start"] <= start and end <= p["end"]
                                                       for p in result["passages"])
                    started = time.perf_counter()
                    tally["peer"]["right"] += peer.answer(question, text).text == city
                    tally["peer"]["seconds"] += time.perf_counter() - started
                    asked += 1
        peer_seconds = tally["peer"]["seconds"] / asked
        for name, counts in tally.items():
            retrieving = name not in ("peer", "ask --read-all")
            rows.append({"relation": relation, "reader": name, "documents": len(documents),
                         "words": round(words / len(documents)), "questions": asked,
                         "em": round(counts["right"] / asked, 3),
                         "seconds_per_question": round(counts["seconds"] / asked, 3),
                         "time_vs_peer": round(counts["seconds"] / asked / peer_seconds, 3),
                         "gold_passage_recall": round(counts["recalled"] / asked, 3) if retrieving else "",
                         "passages_read": round(counts["read"] / asked, 1) if name != "peer" else "",
                         "index_seconds_per_document": round(index_seconds / len(documents), 2)
                         if name == "ask (hybrid)" else ""})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, function in (("reader", reader), ("short", short), ("long", long)):
        command = commands.add_parser(name)
        command.set_defaults(function=function)
        command.add_argument("--out", required=True, help="the folder of the reader (qa-reader/, lifted/)")
        command.add_argument("--seed", type=int, default=0)
        command.add_argument("--json", help="also write the rows to this file")
    commands.choices["reader"].add_argument("--train-examples", type=int, default=2000)
    commands.choices["reader"].add_argument("--epochs", type=int, default=1)
    commands.choices["short"].add_argument("--documents", type=int, default=100)
    commands.choices["long"].add_argument("--relations", nargs="+", default=["born", "moved"],
                                          choices=["born", "moved"])
    commands.choices["long"].add_argument("--documents", type=int, default=3)
    commands.choices["long"].add_argument("--questions", type=int, default=4)
    commands.choices["long"].add_argument("--words", type=int, default=20000)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from longdoc.cpu_memory import configure_allocator

    configure_allocator()
    from longdoc.evaluate.tables import markdown_table

    rows = args.function(args)
    columns = list(dict.fromkeys(key for row in rows for key in row))
    print(markdown_table(columns, [[row.get(key, "") for key in columns] for row in rows]))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
