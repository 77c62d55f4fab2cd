"""The CPU attention kernels' builds side by side (benchmarks.kernel_builds): each entry point of each
build run on the operands the encoder passes it, alternated call by call in one process.

  python scripts/bench_kernel_builds.py [--length 4096] [--talking-heads] [--threads 1] [--repeats 9]
                                        [--build LABEL=FOLDER ...]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's benchmarks/ package, not installed

from benchmarks.kernel_builds import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
