"""The encoder benchmark with the project's targets: `longdoc bench`'s run and table (the same
arguments), then a PASS / FAIL / SKIP line per target (benchmarks/targets.py); with --json, the
command's JSON object with the targets under "checks".

  python scripts/bench_encoder.py [longdoc bench's options]

Exit status: 1 when a measurement fails or a target says FAIL (a target that SKIPs for want of its
measurements does not count), 0 otherwise, 2 for bad options.
"""

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's benchmarks/ package


def main(argv=None) -> int:
    from benchmarks.targets import exit_status, target_checks
    from longdoc.bench import render_table, to_json
    from longdoc.commands import bench
    from longdoc.cpu_memory import configure_allocator
    from longdoc.errors import InputError

    parser = argparse.ArgumentParser(prog="bench_encoder.py", description=__doc__.splitlines()[0])
    bench.add_arguments(parser)
    parser.epilog = None
    args = parser.parse_args(argv)
    if args.batched:
        parser.error("--batched has no targets: run `longdoc bench --batched`")
    configure_allocator()  # as the `longdoc` command: freed memory kept (longdoc/cpu_memory.py)
    try:
        bench.check_device(args)
        result = bench.measure(args)
    except InputError as error:
        print(f"bench_encoder: error: {error}", file=sys.stderr)
        return 2
    checks = target_checks(result)
    if args.json:
        print(json.dumps({**to_json(result), "checks": [asdict(check) for check in checks]}, indent=2))
    else:
        print("\n".join([render_table(result), ""] + [f"{check.status}  {check.detail}" for check in checks]))
    return exit_status(result)


if __name__ == "__main__":
    sys.exit(main())
