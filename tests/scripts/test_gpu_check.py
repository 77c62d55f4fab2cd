"""scripts/gpu_check.py and .sh, the device check, without a GPU: its tables, its refusal where there is
no CUDA GPU (one line, exit 2), and its parts run on CPU tensors in the gpu backend's interpreter mode
(tiny sizes: that they run and what they report, not how fast)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from longdoc.model.config import GlobalLocalConfig
from scripts import gpu_check
from scripts.gpu_check import Machine, SoftmaxShape, Table

REPOSITORY = Path(__file__).resolve().parents[2]
MACHINE = Machine("NVIDIA H100 80GB HBM3", "2.11.0+cu130", "3.6.0", "2026-12-01")
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a CUDA GPU")


def test_a_table_is_markdown_headed_with_the_gpu_the_versions_and_the_date(tmp_path):
    table = Table("softmax", "One layer", ("backend", "median ms", "peak MiB"),
                  [("gpu", 12.3456, 1024.0), ("eager", 0.00123, None)], notes="B=8 | bf16")
    path = table.write(MACHINE, tmp_path / "out")
    assert path == tmp_path / "out" / "softmax.md"
    assert path.read_text() == (
        "# One layer\n\nNVIDIA H100 80GB HBM3; torch 2.11.0+cu130, Triton 3.6.0; 2026-12-01\n\nB=8 | bf16\n\n"
        "| backend | median ms | peak MiB |\n|---|---|---|\n| gpu | 12.35 | 1024 |\n| eager | 0.00123 | - |\n")


def test_the_tests_table_counts_each_files_outcomes_and_names_the_failures(tmp_path):
    junit = tmp_path / "pytest.xml"
    junit.write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.model.test_gpu_kernel" name="test_a"/>'
        '<testcase classname="tests.model.test_gpu_kernel" name="test_b"><failure message="AssertionError: off by 1&#10;'
        'more">trace</failure></testcase>'
        '<testcase classname="tests.model.backends.test_cpu" name="test_c"><skipped message="no compiler"/></testcase>'
        '</testsuite></testsuites>')
    table = gpu_check.tests_table(junit)
    assert table.rows == [("tests/model/backends/test_cpu.py", 0, 0, 1), ("tests/model/test_gpu_kernel.py", 1, 1, 0),
                          ("all", 1, 1, 1)]
    assert table.notes.endswith("Failures:\n- `test_b` (tests/model/test_gpu_kernel.py): AssertionError: off by 1")


@no_gpu
@pytest.mark.parametrize("part", gpu_check.PARTS)
def test_without_a_cuda_gpu_each_part_exits_2_with_one_line(tmp_path, capsys, part):
    assert gpu_check.main([part, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == f"gpu_check {part}: no CUDA GPU here (torch {torch.__version__}): the check runs on one\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("part", [part for part in gpu_check.PARTS if part not in ("etc", "environment")])
def test_only_the_etc_part_runs_on_the_cpu(tmp_path, capsys, part):
    assert gpu_check.main([part, "--device", "cpu", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"gpu_check {part}: --device cpu: only the etc part runs on the CPU\n"
    assert not (tmp_path / "out").exists()


def test_a_missing_module_is_named_with_its_distribution(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(gpu_check.REQUIRED, "no_such_module_here", "no-such-distribution")
    assert gpu_check.main(["environment", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("gpu_check environment: missing no_such_module_here (no-such-distribution): "
                                       "put their wheels in a folder and run with WHEELS=that folder\n")


@no_gpu
@pytest.mark.slow  # (a fresh interpreter imports torch)
def test_the_shell_script_stops_at_its_first_step_without_a_cuda_gpu(tmp_path):
    environment = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    run = subprocess.run(["bash", str(REPOSITORY / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                         env={**environment, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable, "DATA": str(tmp_path)},
                         timeout=300)
    assert run.returncode == 2
    assert run.stderr.splitlines()[-1] == (f"gpu_check environment: no CUDA GPU here (torch {torch.__version__}): the "
                                           "check runs on one")


@pytest.fixture
def interpreter_mode(monkeypatch):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the interpreter mode is set before Triton is imported (tests/conftest.py, without a CUDA GPU)")


@pytest.mark.slow
def test_the_softmax_timing_runs_both_backends_in_every_setting(interpreter_mode):
    shape = SoftmaxShape(batch=1, config=GlobalLocalConfig(hidden_size=8, num_attention_heads=2, long_max_len=8,
                                                       global_max_len=2, local_radius=1, max_relative_distance=1))
    table = gpu_check.softmax_table(torch.device("cpu"), shape, torch.float32, repeats=1, warmups=0)
    assert [row[:4] for row in table.rows[:4]] == [("on", "off", "forward", "gpu"), ("on", "off", "forward", "eager"),
                                                   ("on", "off", "forward+backward", "gpu"),
                                                   ("on", "off", "forward+backward", "eager")]
    assert len(table.rows) == 16 and {row[:2] for row in table.rows} == {("on", "off"), ("on", "on"), ("off", "off"),
                                                                        ("off", "on")}
    for residual, _, mode, backend, milliseconds, ratio, _, rate in table.rows:
        assert milliseconds > 0 and ratio > 0
        bytes_moved = gpu_check.score_traffic(shape, residual == "on", mode != "forward", element=4)[1]
        assert rate == (pytest.approx(bytes_moved / (milliseconds / 1e3) / 1e12) if backend == "gpu" else None)
    assert [row[5] for row in table.rows if row[3] == "eager"] == [1.0] * 8
    assert table.notes.startswith("B=1, L=8, G=2, h=2, d=4, r=1, k=1, float32;")


def test_the_score_traffic_counts_every_pair_of_both_softmaxes_masks():
    config = GlobalLocalConfig(hidden_size=8, num_attention_heads=2, long_max_len=10, global_max_len=3,
                               local_radius=1, max_relative_distance=1)
    shape = SoftmaxShape(batch=2, config=config)
    operands, _ = gpu_check.layer_operands(shape, torch.device("cpu"), torch.float32, residual=True, talking=False,
                                           train=False)
    # (the masks, [B, 1, ..., N], are the pairs of one head)
    pairs = sum(one.mask_bias.numel() for one in operands) * config.num_attention_heads
    assert gpu_check.score_traffic(shape, residual=True, train=False) == (pairs, pairs * (6 / 2 + 4))
    assert gpu_check.score_traffic(shape, residual=True, train=True) == (pairs, pairs * (6 / 2 + 4 + 6 / 2 + 6))
    # (float32: a 4-byte mask bias and scores)
    assert gpu_check.score_traffic(shape, residual=False, train=True, element=4) == (pairs, pairs * (8 / 2 + 8 / 2 + 4))


@pytest.mark.slow
def test_the_attention_timing_sets_both_backends_beside_sdpa_at_each_length(interpreter_mode):
    config = GlobalLocalConfig(hidden_size=8, num_attention_heads=2, long_max_len=16, global_max_len=1,
                               local_radius=1, max_relative_distance=1)
    table = gpu_check.attention_table(torch.device("cpu"), lengths=(16, 32), dtype=torch.float32, repeats=1,
                                      warmups=0, config=config)
    assert [row[:3] for row in table.rows[:3]] == [
        (16, "forward", "ours, gpu backend"), (16, "forward", "ours, eager backend"), (16, "forward", "BERT, SDPA")]
    assert len(table.rows) == 12 and {row[:2] for row in table.rows} == {
        (length, mode) for length in (16, 32) for mode in ("forward", "forward+backward")}
    for length, mode, attention, milliseconds, ratio, _, traffic, rate in table.rows:
        assert milliseconds > 0 and ratio > 0
        if attention == "BERT, SDPA":
            assert ratio == 1.0 and traffic is None
        else:
            sized = SoftmaxShape(1, GlobalLocalConfig(hidden_size=8, num_attention_heads=2, long_max_len=length,
                                                      global_max_len=length // 16, local_radius=1,
                                                      max_relative_distance=1))
            bytes_moved = gpu_check.score_traffic(sized, True, mode != "forward", element=4)[1]
            assert traffic == bytes_moved / 1e9 and rate == pytest.approx(bytes_moved / (milliseconds / 1e3) / 1e12)
    assert table.notes.startswith("B=1, G=L/16, h=2, d=4, r=1, float32.")


@pytest.mark.slow
def test_the_etc_comparison_reports_each_backends_gap_against_its_tolerance(interpreter_mode):
    case = gpu_check.ETC_FIXTURES / "padding"
    table = gpu_check.etc_table(torch.device("cpu"), [case], precisions=("float32",), bert=False)
    (_, _, gpu, *gpu_gaps, gpu_within), (_, _, eager, *eager_gaps, eager_within) = table.rows
    assert (gpu, eager) == ("gpu", "eager") and table.rows[0][:2] == ("padding", "float32")
    assert eager_gaps == [0.0, 0.0, 0.0] and eager_within == "yes"  # (the reference itself)
    assert 0 < gpu_gaps[2] <= 1 and gpu_within == "yes" and max(gpu_gaps[:2]) < 1e-4


def test_on_the_cpu_the_etc_part_sets_the_fixtures_beside_transformers_bert():
    case = gpu_check.ETC_FIXTURES / "packed"
    table = gpu_check.etc_table(torch.device("cpu"), [case], backends=("eager",))
    assert [row[:3] for row in table.rows] == [
        ("packed", precision, "eager") for precision in gpu_check.PRECISIONS] + [
        (gpu_check.BERT_CASE, precision, "transformers (eager)") for precision in gpu_check.PRECISIONS]
    for case_name, precision, _, long_gap, global_gap, share, within in table.rows:
        assert within == ("yes" if share <= 1 else "NO")
        if precision == "float32":  # each model against itself, on the same device and dtype
            assert (long_gap, share) == (0.0, 0.0)
        else:  # what bfloat16 costs: visible, and under a tenth of the outputs' scale
            assert 0 < long_gap < 0.1 and share > 0
        assert (global_gap is None) == (case_name == gpu_check.BERT_CASE)
    assert "transformers' BertModel" in table.notes and table.title == "Converted ETC fixtures: CPU against CPU float32"


@pytest.mark.slow
def test_a_task_trains_and_predicts_as_a_user_runs_it(shared_data, tmp_path):
    from longdoc.convert.pretrained import minilm_path

    table = gpu_check.tasks_table(torch.device("cpu"), shared_data, Path(minilm_path()), tmp_path,
                                  runs=gpu_check.TASK_RUNS[:1])
    (task, train_exit, train_seconds, predict_exit, predict_seconds, failure), pretrain = table.rows
    assert (task, train_exit, predict_exit, failure) == ("wikihop", 0, 0, "") and train_seconds > 0 < predict_seconds
    assert pretrain[:2] == ("(pretrain)", 0)
    assert (tmp_path / "wikihop-predictions").is_file() and (tmp_path / "pretrain" / "config.json").is_file()


@pytest.mark.slow
def test_the_hotpotqa_step_compares_the_engines_rate_with_longformers(shared_data, tmp_path, monkeypatch):
    from longdoc.convert.pretrained import minilm_path
    from longdoc.model.config import PRESETS

    # A shape of two narrow layers for both models: the table, not the rate, is under test.
    monkeypatch.setitem(PRESETS, "two-layer", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                                  intermediate_size=128))
    table = gpu_check.hotpotqa_table(torch.device("cpu"), shared_data, Path(minilm_path()), tmp_path, batch_size=2,
                                     steps=2, log_steps=1, preset="two-layer", length=512)
    (ours, _, our_rate, our_hours), (theirs, _, their_rate, their_hours), ratio = table.rows
    assert our_rate > 0 and their_rate > 0 and ratio[2] == pytest.approx(our_rate / their_rate)
    windows = gpu_check._windows_per_example(tmp_path / "hotpotqa-train.log")
    assert windows > 1  # (512 wordpieces: HotpotQA's contexts take several windows)
    assert our_hours == pytest.approx(gpu_check.HOTPOTQA_EXAMPLES * windows / our_rate / 3600)
    assert "exit status 0" in table.notes


@pytest.mark.slow
def test_the_tiles_sweep_times_each_tiling_and_its_gap_from_the_eager_backend(interpreter_mode):
    shape = SoftmaxShape(batch=1, config=GlobalLocalConfig(hidden_size=32, num_attention_heads=2, long_max_len=64,
                                                       global_max_len=4, local_radius=8, max_relative_distance=4))
    table = gpu_check.tiles_table(torch.device("cpu"), shape, torch.float32, repeats=1, warmups=0,
                                  candidates=((32, 16, 4, None), (16, 32, 4, 2)))
    assert [row[0] for row in table.rows] == ["today's (tiles_for)", "32 x 16, 4 warps, default stages",
                                              "16 x 32, 4 warps, 2 stages"]
    for label, forward, train, gap, failure in table.rows:
        assert failure == "" and forward > 0 and train > 0 and gap < 1e-5, (label, failure)
    from longdoc.model.kernels.gpu import softmax as gpu_softmax

    assert gpu_softmax.tiles_for.__module__ == gpu_softmax.__name__  # today's choice is back in place


@pytest.mark.slow
def test_a_tiling_that_cannot_run_is_a_row_saying_why(interpreter_mode, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("out of resource: shared memory, Required: 262144, Hardware limit: 232448")

    monkeypatch.setattr(gpu_check, "_gap_to_eager", broken)
    shape = SoftmaxShape(batch=1, config=GlobalLocalConfig(hidden_size=8, num_attention_heads=2, long_max_len=8,
                                                       global_max_len=2, local_radius=1, max_relative_distance=1))
    (row,) = gpu_check.tiles_table(torch.device("cpu"), shape, torch.float32, repeats=1, warmups=0,
                                   candidates=()).rows
    assert row == ("today's (tiles_for)", None, None, None,
                   "RuntimeError: out of resource: shared memory, Required: 262144, Hardware limit: 232448")
