"""Continued pretraining as a script: `longdoc pretrain` with the same arguments, library and exit codes."""

import sys

from longdoc.cli import main

if __name__ == "__main__":
    sys.exit(main(["pretrain", *sys.argv[1:]]))
