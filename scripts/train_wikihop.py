"""Fine-tune a model on WikiHop: the same as `longdoc train wikihop ...` (one engine, longdoc.train)."""

import sys

from longdoc.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", "wikihop", *sys.argv[1:]]))
