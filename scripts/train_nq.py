"""Fine-tune a model on Natural Questions: the same as `longdoc train nq ...` (one engine, longdoc.train)."""

import sys

from longdoc.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", "nq", *sys.argv[1:]]))
