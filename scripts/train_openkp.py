"""Fine-tune a model on OpenKP: the same as `longdoc train openkp ...` (one engine, longdoc.train)."""

import sys

from longdoc.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", "openkp", *sys.argv[1:]]))
