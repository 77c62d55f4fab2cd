"""scripts/bench_kernel_builds.py (benchmarks.kernel_builds): the kernel builds' entry points timed on the operands the
encoder passes them, one row per kind of call, one column per build."""

import torch

from benchmarks import kernel_builds
from longdoc.model.kernels import cpu as kernels
from tests.model.conftest import kernel  # noqa: F401 (the fixture: the built kernels, or a skip)


def test_every_kind_of_call_is_timed_on_every_build(kernel, capsys, tmp_path):
    # The build in use, once more under a label of its own (as another checkout's would be given).
    folder, _ = kernels.build_location()
    assert kernel_builds.main(["--length", "64", "--repeats", "1", "--build", f"again={folder}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header, rows = lines[1].split(), lines[2:]
    assert header[0] == "call" and header[-1] == "again"
    calls = {line.rsplit(None, len(header) - 1)[0] for line in rows}
    for expected in ("attention_forward long (weights kept)", "attention_forward global (carried, weights kept)",
                     "attention_backward long", "attention_backward global", "attention_forward long (carried)"):
        assert expected in calls, calls
    assert all(float(cell) > 0 for line in rows for cell in line.split()[-(len(header) - 1):])
    empty = tmp_path / "empty"
    empty.mkdir()
    try:
        kernel_builds.main(["--length", "64", "--build", f"none={empty}"])
    except SystemExit as refusal:
        assert str(refusal) == f"kernel_builds: --build none={empty}: no built module (*.so) in {empty}"
    else:
        raise AssertionError("a folder without a build was not refused")


def test_a_recorded_call_keeps_its_strides_and_its_aliases():
    # Without autograd the encoder passes summed_out as the carried scores themselves (written over
    # them): the copy timed passes one tensor twice as well, and the views at their strides.
    carried, kept = torch.arange(6.0).view(2, 3), torch.zeros(2, 3)
    query = torch.arange(6.0).view(2, 3).t()
    copy = kernel_builds.copied(dict(carried=carried, summed_out=carried, probs_out=kept, query=query, window_block=4))
    assert copy["summed_out"] is copy["carried"] and copy["carried"] is not carried
    assert torch.equal(copy["carried"], carried) and copy["probs_out"] is not copy["carried"]
    assert copy["query"].stride() == query.stride() and torch.equal(copy["query"], query)
    assert copy["window_block"] == 4
