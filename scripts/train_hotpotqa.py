"""Fine-tune a model on HotpotQA: the same as `longdoc train hotpotqa ...` (one engine, longdoc.train)."""

import sys

from longdoc.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", "hotpotqa", *sys.argv[1:]]))
