"""`python -m tests.train.toy_train ARGS`: `longdoc train toy ARGS` with the toy task registered, as a
scripts/train_<task>.py is for a real task (and the same under torchrun -m).

With LONGDOC_TOY_HANG_AT=N set, the N-th batch collated creates the file LONGDOC_TOY_HANG_MARKER names
and blocks, so a test can kill the run at a known point between checkpoints. With LONGDOC_TOY_FAIL_AT=N,
the N-th batch collated in the process of rank LONGDOC_TOY_FAIL_RANK (default 0) is a bad input (an
InputError, as a row found bad at collation is), so a test sees what one failing process does to a
run of several."""

import os
import sys
import time

from tests.train import toy_task

from longdoc.cli import main
from longdoc.errors import InputError

_collated = 0


def _collate_then_maybe_hang(rows, pad_token_id):
    global _collated
    _collated += 1
    if _collated == int(os.environ.get("LONGDOC_TOY_HANG_AT", "0")):
        open(os.environ["LONGDOC_TOY_HANG_MARKER"], "w").close()
        time.sleep(600)
    if (_collated == int(os.environ.get("LONGDOC_TOY_FAIL_AT", "0"))
            and os.environ.get("RANK", "0") == os.environ.get("LONGDOC_TOY_FAIL_RANK", "0")):
        raise InputError(f"batch {_collated}: a bad row (LONGDOC_TOY_FAIL_AT)")
    return _original_collate(rows, pad_token_id)


_original_collate = toy_task.collate
toy_task.collate = _collate_then_maybe_hang

if __name__ == "__main__":
    toy_task.register_toy_tasks()
    sys.exit(main(["train", "toy", *sys.argv[1:]]))
