"""Benchmarks of `longdoc ask` (docs/benchmarks.md).

  python scripts/bench_ask.py retrieval [--data HOTPOT_JSON] [--passages 4 8 16]
      how often one / all gold supporting sentences of each question lie inside the retrieved
      passages, for MiniLM alone (with and without the second hop), BM25 alone and both fused, at
      each fixed number of passages and with the default adaptive budget
      (benchmarks.ask.retrieval_quality), on all the paragraphs of a HotpotQA file as one
      document (default: the sample in ../shared/data).
  python scripts/bench_ask.py speed [--model DIR] [--words 100000]
      seconds to index a generated document of that many words (nothing cached), and per answer
      once indexed (retrieval + reading), with the model DIR or, without one, an untrained
      HotpotQA model on the lifted MiniLM (same size, same time).
  python scripts/bench_ask.py indexing [--data HOTPOT_JSON] [--words 20000]
      indexing throughput (words per second) and peak memory, each in a fresh process, beside
      MiniLM's tokenizer and forward alone on the same passages (benchmarks.indexing),
      for the reader benchmark's generated document of that many words and the HotpotQA file's
      paragraphs as one document.
  python scripts/bench_ask.py indexing --alternate [--files 30] [--rounds 3] [--data HOTPOT_JSON]
      indexing that many files of the scale corpus (below) against MiniLM's tokenizer and forward
      alone on what indexing embeds of them, alternated in one process on one thread: CPU and wall
      seconds, and indexing's throughput as a share of the forward's (benchmarks.indexing.alternated_rows).
  python scripts/bench_ask.py sentences [--data HOTPOT_JSON]
      sentence mode (no reader) on real text: each HotpotQA question that is not yes/no asked of its
      own paragraphs; how often the first answer sentence holds the gold answer, beside plain MiniLM
      ranking of every sentence (benchmarks.ask.sentence_mode_rows).
  python scripts/bench_ask.py no-answer [--documents 40] [--calibration 20]
      the no-answer rule: how many right, off-topic and other-person questions reach the evidence
      floor on the demo's held-out generated documents (benchmarks.ask.no_answer_rows).
  python scripts/bench_ask.py corpus [--data HOTPOT_JSON] [--rounds 3] [--reader DIR]
      the command line on the HotpotQA file's paragraphs, one file each: `longdoc index` on a fresh
      cache, then a cached `longdoc ask --question` over every file and over one, beside `python -c
      "import torch"` in the same rounds, and the time a question takes in one `ask --json` process
      (benchmarks.ask.corpus_timing_rows); with --reader DIR (the lifted QA reader of
      `scripts/bench_readers.py reader --out OUT`: OUT/lifted) both also with `--model DIR --passages 8`.
  python scripts/bench_ask.py scale [--data HOTPOT_JSON] [--documents 10000] [--words 500] [--rounds 3]
      a corpus of that many generated files (HotpotQA sentences drawn at random, seeded: the same
      files each run; benchmarks.ask.write_generated_corpus): `longdoc index` on a fresh cache, or
      over the index kept in --work (seconds, words/s, peak resident memory), a cached `longdoc ask --question` beside `python -c
      "import torch"`, a question in one `ask --json` process, and the vector search exact against
      approximate (ms, recall@8) (benchmarks.ask.scale_rows).
All print a markdown table and, with --json FILE, write the rows.
"""

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's benchmarks/ package, which is not installed
SAMPLE = ROOT.parent / "shared" / "data" / "hotpotqa" / "hotpot_dev_distractor_v1.first53.json"


def retrieval(args) -> list[dict]:
    from benchmarks.ask import hotpotqa_document, retrieval_quality
    from longdoc.ask.embedding import SentenceEmbedder

    document = hotpotqa_document(args.data)
    print(f"{args.data}: {len(document.text.split())} words, {len(document.questions)} questions", file=sys.stderr)
    with tempfile.TemporaryDirectory() as cache:
        rows = retrieval_quality(document, SentenceEmbedder(), tuple(args.passages), cache_root=Path(cache))
    return [{**row, "one": round(row["one"], 3), "all": round(row["all"], 3), "read": round(row["read"], 1),
             "words": round(row["words"])} for row in rows]


def speed(args) -> list[dict]:
    from benchmarks.ask import speed_rows
    from longdoc.tasks import REGISTRY
    from longdoc.tasks.multihop.generator import make_examples

    return speed_rows(words=args.words, tasks=REGISTRY, reader_task="hotpotqa", make_examples=make_examples,
                      model_dir=args.model, questions=args.questions)


def no_answer(args) -> list[dict]:
    from benchmarks.ask import no_answer_rows
    from longdoc.demo import DemoData, write_document
    from longdoc.tasks.multihop.generator import make_examples

    data = DemoData()

    def held_out(n: int, tokenizer) -> list[dict]:  # the demo's dev documents: its settings, its dev seed
        return make_examples(n, seed=data.seed + 1, length=data.length, min_distance=data.min_distance,
                             comparison_fraction=data.comparison_fraction, relation_share=data.relation_share,
                             chain_order=data.chain_order, tokenizer=tokenizer, progress=False)

    return no_answer_rows(held_out, write_document, args.documents, args.calibration)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    quality = modes.add_parser("retrieval", help="retrieval quality on a HotpotQA file's paragraphs")
    quality.add_argument("--data", type=Path, default=SAMPLE)
    quality.add_argument("--passages", type=int, nargs="+", default=[4, 8, 16])
    timing = modes.add_parser("speed", help="indexing and answering time on a long generated document")
    timing.add_argument("--model", type=Path, help="a trained model (default: untrained, same size)")
    timing.add_argument("--words", type=int, default=100_000)
    timing.add_argument("--questions", type=int, default=5)
    indexing = modes.add_parser("indexing", help="indexing throughput and peak memory beside MiniLM's forward")
    indexing.add_argument("--data", type=Path, default=SAMPLE)
    indexing.add_argument("--words", type=int, default=20_000)
    indexing.add_argument("--alternate", action="store_true",
                          help="index generated files and run MiniLM alone on their texts, alternated in one process")
    indexing.add_argument("--files", type=int, default=30)
    indexing.add_argument("--rounds", type=int, default=3)
    sentences = modes.add_parser("sentences", help="sentence mode on real text: the first answer sentence of each "
                                                   "HotpotQA question asked of its own paragraphs")
    sentences.add_argument("--data", type=Path, default=SAMPLE)
    refusal = modes.add_parser("no-answer", help="the evidence floor on generated documents")
    refusal.add_argument("--documents", type=int, default=40)
    refusal.add_argument("--calibration", type=int, default=20)
    corpus = modes.add_parser("corpus", help="cached ask over a HotpotQA file's paragraphs, one file each, "
                                             "beside import torch")
    corpus.add_argument("--data", type=Path, default=SAMPLE)
    corpus.add_argument("--rounds", type=int, default=3)
    corpus.add_argument("--reader", type=Path, metavar="DIR",
                        help="also time ask with this reader (a lifted QA reader: scripts/bench_readers.py reader)")
    scale = modes.add_parser("scale", help="a generated corpus of many files: indexing, time a question, "
                                           "approximate search recall")
    scale.add_argument("--data", type=Path, default=SAMPLE)
    scale.add_argument("--documents", type=int, default=10_000)
    scale.add_argument("--words", type=int, default=500)
    scale.add_argument("--rounds", type=int, default=3)
    scale.add_argument("--work", type=Path, help="keep the corpus and its index here (default: a temporary folder)")
    for sub in (quality, timing, indexing, sentences, refusal, corpus, scale):
        sub.add_argument("--json", type=Path, metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    from longdoc.cpu_memory import configure_allocator

    configure_allocator()  # as the `longdoc` command: freed memory kept (longdoc/cpu_memory.py)
    if args.mode == "indexing" and args.alternate:
        from benchmarks.ask import write_generated_corpus
        from benchmarks.indexing import alternated_rows

        with tempfile.TemporaryDirectory() as work:
            write_generated_corpus(args.data, Path(work), args.files)
            texts = [path.read_text(encoding="utf-8") for path in sorted(Path(work).iterdir())]
        rows = alternated_rows(texts, args.rounds)
    elif args.mode == "indexing":
        from benchmarks.ask import hotpotqa_document
        from benchmarks.indexing import indexing_rows
        from benchmarks.readers import make_fact_questions

        generated = make_fact_questions(1, seed=2, words=args.words, distractors=40)[0].context
        rows = indexing_rows({"generated (reader benchmark)": generated,
                              "HotpotQA sample paragraphs": hotpotqa_document(args.data).text})
    elif args.mode == "corpus":
        from benchmarks.ask import corpus_timing_rows

        with tempfile.TemporaryDirectory() as work:
            rows = corpus_timing_rows(args.data, Path(work), args.rounds, args.reader)
    elif args.mode == "scale":
        from benchmarks.ask import scale_rows

        with tempfile.TemporaryDirectory() as work:
            rows = scale_rows(args.data, args.work or Path(work), args.documents, args.words, args.rounds)
    elif args.mode == "no-answer":
        rows = no_answer(args)
    elif args.mode == "sentences":
        from benchmarks.ask import sentence_mode_rows

        with tempfile.TemporaryDirectory() as cache:
            rows = sentence_mode_rows(args.data, Path(cache))
    else:
        rows = retrieval(args) if args.mode == "retrieval" else speed(args)
    from longdoc.evaluate.tables import markdown_table

    print(markdown_table(list(rows[0]), [list(row.values()) for row in rows]))
    if args.json:
        from longdoc.io import atomic_write_json

        atomic_write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
