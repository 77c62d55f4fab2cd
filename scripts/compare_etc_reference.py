"""Compare a converted ETC model with etcmodel's own outputs on a reference case.

  python scripts/compare_etc_reference.py CASE_DIR MODEL_DIR

CASE_DIR is a case written by scripts/make_etc_reference.py (inputs.npz, outputs.npz: the inputs
etcmodel received and its long and global outputs), MODEL_DIR what `longdoc convert etc --from
CASE_DIR --out MODEL_DIR` wrote. Prints the largest difference at real tokens on both attention
paths (compiled kernel and eager) and the time of each forward pass.
"""

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch

from longdoc.convert.etc import etcmodel_inputs
from longdoc.model.pretrained import GlobalLocalModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", type=Path, help="a reference case folder (inputs.npz, outputs.npz)")
    parser.add_argument("model", type=Path, help="the folder `longdoc convert etc` wrote from it")
    args = parser.parse_args()
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # the loading bar of 294 tensors says nothing here
    reference = np.load(args.case / "outputs.npz")
    long_valid, global_valid = reference["long_valid"].astype(bool), reference["global_valid"].astype(bool)
    model = GlobalLocalModel.from_pretrained(args.model).eval()
    inputs = etcmodel_inputs(np.load(args.case / "inputs.npz"), long_valid, global_valid)
    print(f"{args.case}: {int(long_valid.sum())} long and {int(global_valid.sum())} global tokens")
    for path, kernels in (("compiled", "1"), ("eager", "0")):
        os.environ["LONGDOC_KERNELS"] = kernels
        started = time.perf_counter()
        with torch.no_grad():
            output = model(**inputs)
        seconds = time.perf_counter() - started
        long_gap = np.abs(output.long_hidden_state.numpy() - reference["long_output"])[long_valid].max()
        global_gap = np.abs(output.global_hidden_state.numpy() - reference["global_output"])[global_valid].max()
        print(f"{path:>8}: max |longdoc - etcmodel| long {long_gap:.1e}, global {global_gap:.1e} "
              f"(forward {seconds:.1f} s)")


if __name__ == "__main__":
    main()
