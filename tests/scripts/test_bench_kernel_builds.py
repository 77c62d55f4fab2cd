"""scripts/bench_kernel_builds.py (benchmarks.kernel_builds): the kernel builds' entry points timed on the operands the
encoder passes them, one row per kind of call, one column per build."""

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
