"""The documents that ask, index and serve could not read, told on stderr."""

import sys
from collections.abc import Sequence


def tell_unreadable(command: str, errors: Sequence, readable: int, going_on: str) -> None:
    """Each path that could not be read named once, then, where others were read, one line counting
    both: with thousands of unreadable files among readable ones the count is what a user reads last.
    `going_on`: what the command does with the files read ("answering from", "indexing")."""
    for error in errors:
        print(f"longdoc {command}: error: {error}", file=sys.stderr)
    if errors and readable:
        paths = "path" if len(errors) == 1 else "paths"
        files = "file" if readable == 1 else "files"
        print(f"longdoc {command}: {len(errors)} {paths} could not be read (named above); {going_on} the "
              f"{readable} {files} read", file=sys.stderr)
