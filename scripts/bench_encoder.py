"""The encoder benchmark as a script: `longdoc bench` with the same arguments, library and exit codes."""

import sys

from longdoc.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
