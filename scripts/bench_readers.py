"""A Hub-style extractive QA reader through `longdoc ask`, against the standard sliding-window reader.

  python scripts/bench_readers.py reader --out DIR [--train-examples 2000]
      fine-tunes the packaged MiniLM as transformers' BertForQuestionAnswering (its own model and
      loss) on short generated contexts ("P was born in C." -> "Where was P born?"), saves it as a
      Hub reader is saved (DIR/qa-reader) and lifts it with `longdoc lift` (DIR/lifted).
  python scripts/bench_readers.py short --out DIR [--documents 100]
      short documents (about 150 words, 3 same-relation distractors): how often `longdoc ask`'s
      answer equals the peer's, and each one's exact match.
  python scripts/bench_readers.py long --out DIR [--documents 4 --questions 10 --words 20000]
      documents of 20,000 words with 40 same-relation distractors, the asked facts at random depths:
      exact match and seconds per question of each (one process; longdoc's index built first, its
      time reported apart).

The peer (longdoc.bench.readers.SlidingWindowReader) reads every window of 384 wordpieces (stride
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


def _fact_documents(count: int, *, seed: int, words: int, distractors: int):
    from longdoc.bench.readers import make_fact_questions

    return make_fact_questions(count, seed=seed, words=words, distractors=distractors)


def reader(args) -> list[dict]:
    from longdoc.bench.readers import finetune_qa_reader
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

        path = folder / "document.txt"
        path.write_text(context, encoding="utf-8")
        sources, errors = load_sources([path])
        assert not errors, errors
        return AskSession(sources, self.model_dir, progress=False, cache_root=self.cache_root)

    @staticmethod
    def answer(session, question: str) -> str:
        answers = session.ask(question)["answers"]
        return answers[0]["text"] if answers else ""


def short(args) -> list[dict]:
    from longdoc.bench.readers import SlidingWindowReader

    out = Path(args.out)
    peer = SlidingWindowReader(out / "qa-reader")
    documents = _fact_documents(args.documents, seed=args.seed + 1, words=150, distractors=3)
    ours = LongdocReader(out / "lifted", Path(tempfile.mkdtemp()))
    agree = ours_right = peer_right = 0
    with tempfile.TemporaryDirectory() as folder:
        for document in documents:
            session = ours.open(document.context, Path(folder))
            mine = ours.answer(session, document.question)
            theirs = peer.answer(document.question, document.context).text
            agree += mine == theirs
            ours_right += mine == document.answer
            peer_right += theirs == document.answer
    n = len(documents)
    return [{"documents": n, "words": 150, "agreement": round(agree / n, 3),
             "longdoc_em": round(ours_right / n, 3), "peer_em": round(peer_right / n, 3)}]


def long(args) -> list[dict]:
    import random

    from longdoc.bench.readers import QUESTIONS, SlidingWindowReader

    out = Path(args.out)
    peer = SlidingWindowReader(out / "qa-reader")
    ours = LongdocReader(out / "lifted", Path(tempfile.mkdtemp()))
    documents = _fact_documents(args.documents, seed=args.seed + 2, words=args.words, distractors=40)
    rows = {"longdoc": [0, 0.0], "peer": [0, 0.0]}
    index_seconds, asked = 0.0, 0
    with tempfile.TemporaryDirectory() as folder:
        for number, document in enumerate(documents):
            rng = random.Random(f"{args.seed}:{number}")
            chosen = rng.sample(document.facts, min(args.questions, len(document.facts)))
            started = time.perf_counter()
            session = ours.open(document.context, Path(folder))
            index_seconds += time.perf_counter() - started
            for person, city in chosen:
                question = rng.choice(QUESTIONS).format(person=person)
                for name, answer in (("longdoc", lambda q: ours.answer(session, q)),
                                     ("peer", lambda q: peer.answer(q, document.context).text)):
                    started = time.perf_counter()
                    text = answer(question)
                    rows[name][1] += time.perf_counter() - started
                    rows[name][0] += text == city
                asked += 1
    return [{"reader": name, "documents": len(documents), "words": args.words, "questions": asked,
             "em": round(right / asked, 3), "seconds_per_question": round(seconds / asked, 3),
             **({"index_seconds_per_document": round(index_seconds / len(documents), 2)} if name == "longdoc" else {})}
            for name, (right, seconds) in rows.items()]


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
    commands.choices["long"].add_argument("--documents", type=int, default=4)
    commands.choices["long"].add_argument("--questions", type=int, default=10)
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
