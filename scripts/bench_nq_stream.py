"""Natural Questions streaming benchmark: peak memory of reading against file size, and examples per
second of feature building with 1 and 2 processes.

    python scripts/bench_nq_stream.py --sizes-mb 60 300 --feature-examples 200 --num-proc 1 2

1. Reading: for each size, a synthetic original-format file (longdoc.tasks.nq.synthetic: made-up
   text, lines of about 200 KB like real NQ lines with their HTML) gzipped to about that many MB
   is read whole by `longdoc.tasks.nq.reader.read_examples` in a fresh process; its peak resident
   memory (ru_maxrss) must not grow with the file.
2. Features: a synthetic simplified-format file of `--feature-examples` examples is turned into
   training rows (`iter_training_rows`, 512-token windows, MiniLM's tokenizer) in a fresh process
   per `--num-proc` value; examples per second and peak memory (the process and its workers).
Files are written in a temporary folder (or --work-dir) and removed unless --keep.
"""

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _peak_mb() -> float:
    # Linux reports ru_maxrss in KiB.
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024


def measure_read(path: str) -> dict:
    from longdoc.tasks.nq.reader import read_examples

    start = time.perf_counter()
    count = sum(1 for _ in read_examples(path))
    seconds = time.perf_counter() - start
    return {"examples": count, "seconds": seconds, "peak_rss_mb": _peak_mb()}


def measure_features(path: str, num_proc: int) -> dict:
    from longdoc import GlobalLocalConfig
    from longdoc.convert.pretrained import default_tokenizer
    from longdoc.tasks.nq import NQOptions
    from longdoc.tasks.nq.features import iter_training_rows
    from longdoc.tasks.nq.model import NQModel

    tokenizer = default_tokenizer()
    config = GlobalLocalConfig(long_max_len=512, global_max_len=96)
    config.task_options = {**NQModel.default_task_options, "stride": 128}
    options = NQOptions(stride=128, null_window_keep_rate=1.0)
    start = time.perf_counter()
    examples = windows = 0
    for rows in iter_training_rows(path, tokenizer, config, options, num_proc=num_proc, progress=False):
        examples += 1
        windows += len(rows)
    seconds = time.perf_counter() - start
    return {"examples": examples, "windows": windows, "seconds": seconds, "examples_per_second": examples / seconds,
            "peak_rss_mb": _peak_mb()}


def _in_fresh_process(*arguments: str) -> dict:
    output = subprocess.run([sys.executable, __file__, *arguments], check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[60, 300], help="gzipped file sizes to read")
    parser.add_argument("--feature-examples", type=int, default=200, help="examples in the feature-building file")
    parser.add_argument("--num-proc", type=int, nargs="+", default=[1, 2], help="process counts for feature building")
    parser.add_argument("--work-dir", type=Path, help="where to write the synthetic files (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the synthetic files")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--measure-read", help=argparse.SUPPRESS)
    parser.add_argument("--measure-features", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure_read:
        print(json.dumps(measure_read(args.measure_read)))
        return 0
    if args.measure_features:
        print(json.dumps(measure_features(args.measure_features[0], int(args.measure_features[1]))))
        return 0

    from longdoc.io import atomic_write_json
    from longdoc.tasks.nq.synthetic import write_synthetic_nq

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_nq_stream_"))
    work.mkdir(parents=True, exist_ok=True)
    results = {"read": [], "features": []}
    # About 100 KB gzipped per line at 200 KB of filler (measured: 100 lines -> 12.3 MB).
    line_bytes, padding = 123_000, 200_000
    print("| file (synthetic, original format, gzipped) | lines | read s | peak RSS MB |")
    print("| --- | --- | --- | --- |")
    for size in args.sizes_mb:
        lines = max(1, int(size * 1e6 / line_bytes))
        path = write_synthetic_nq(work / f"synthetic-nq-{size:g}mb.jsonl.gz", lines, original_format=True, seed=0,
                                  paragraphs=20, html_padding_bytes=padding)
        measured = _in_fresh_process("--measure-read", str(path))
        measured.update(file_mb=path.stat().st_size / 1e6, lines=lines)
        results["read"].append(measured)
        print(f"| {measured['file_mb']:.0f} MB | {lines} | {measured['seconds']:.1f} | {measured['peak_rss_mb']:.0f} |")
        if not args.keep:
            path.unlink()
    features_path = write_synthetic_nq(work / "synthetic-nq-features.jsonl", args.feature_examples, seed=1,
                                       paragraphs=30, paragraph_words=40)
    print()
    print("| feature building (512-token windows) | examples | windows | s | examples/s | peak RSS MB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for num_proc in args.num_proc:
        measured = _in_fresh_process("--measure-features", str(features_path), str(num_proc))
        measured["num_proc"] = num_proc
        results["features"].append(measured)
        print(f"| num_proc {num_proc} | {measured['examples']} | {measured['windows']} | {measured['seconds']:.1f} | "
              f"{measured['examples_per_second']:.1f} | {measured['peak_rss_mb']:.0f} |")
    if not args.keep:
        features_path.unlink()
    if args.json:
        atomic_write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
