"""`longdoc bench --profile` (longdoc.bench.profile): one forward and one forward+backward of ours and
of BERT with SDPA split by part of the model, the parts summing to the step's time; the labels are
there while profiling only."""

import os

import pytest
from longdoc.bench import BenchSettings, Shape
from longdoc.bench.models import build_runner
from longdoc.bench.profile import (
    FEED_FORWARD, GLOBAL_SOFTMAX, GLUE, LAYER_NORMS, LONG_SOFTMAX, PARTS, PROJECTIONS, SDPA, _attention_backend,
    _without_profiler_trace_lines,
    labelled, module_parts, profiled_variants, render_profile, run_profile,
)
from longdoc.bench.settings import BERT, FORWARD, REFERENCE, TRAIN, Job

TINY = Shape(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, local_radius=4, global_tokens=16,
             vocab_size=100)
LENGTH = 96


@pytest.fixture(scope="module")
def profiles():
    settings = BenchSettings(shape=TINY, repeats=1, threads=1)
    return {(p.model, p.mode): p for p in run_profile(settings, LENGTH, profiled_variants(settings))}


def test_the_parts_sum_to_the_steps_time(profiles):
    assert set(profiles) == {(model, mode) for model in (REFERENCE.name, BERT) for mode in (FORWARD, TRAIN)}
    for (model, mode), step in profiles.items():
        assert list(step.parts_ms) == list(PARTS)
        # Every operator's self time once: none lost (a backward's, say), none counted twice.
        assert sum(step.parts_ms.values()) == pytest.approx(step.total_ms, rel=1e-3), (model, mode)


def test_each_model_has_its_parts(profiles):
    for mode in (FORWARD, TRAIN):
        ours, bert = profiles[REFERENCE.name, mode].parts_ms, profiles[BERT, mode].parts_ms
        for part in (PROJECTIONS, LONG_SOFTMAX, GLOBAL_SOFTMAX, FEED_FORWARD, LAYER_NORMS):
            assert ours[part] > 0, (mode, part)
        assert ours[SDPA] == 0
        for part in (PROJECTIONS, SDPA, FEED_FORWARD, LAYER_NORMS):
            assert bert[part] > 0, (mode, part)
        assert bert[LONG_SOFTMAX] == bert[GLOBAL_SOFTMAX] == 0
    # The backward's operators go to the parts whose forward made their nodes, not to the glue: the
    # backward of the long softmax's kernel is the long softmax's, the feed-forward's the feed-forward's.
    for model in (REFERENCE.name, BERT):
        assert not any(profiles[model, FORWARD].backward_ms.values()), model
        train = profiles[model, TRAIN]
        assert all(0 <= train.backward_ms[part] <= train.parts_ms[part] for part in PARTS), model
        assert train.backward_ms[FEED_FORWARD] > 0 and train.backward_ms[PROJECTIONS] > 0, model
    train = profiles[REFERENCE.name, TRAIN]
    assert train.backward_ms[LONG_SOFTMAX] > 0 and train.backward_ms[GLOBAL_SOFTMAX] > 0
    assert train.parts_ms[GLUE] < 0.6 * train.total_ms


def test_the_table_names_every_part_and_the_total(profiles):
    settings = BenchSettings(shape=TINY, repeats=1, threads=1)
    table = render_profile(list(profiles.values()), LENGTH, settings, "a CPU")
    for part in (PROJECTIONS, LONG_SOFTMAX, GLOBAL_SOFTMAX, SDPA, FEED_FORWARD, LAYER_NORMS, GLUE, "total"):
        assert any(line.startswith(part) for line in table.splitlines()), part
    assert "ours(res) fwd+bwd" in table and "bert fwd" in table


def test_the_labels_are_there_while_profiling_only():
    runner = build_runner(Job(BenchSettings(shape=TINY, plain_process=True), REFERENCE, LENGTH, FORWARD))
    model = runner.model
    parts = module_parts(model)
    assert any(part == PROJECTIONS and name.startswith("encoder.layers.0.attention.") for name, part in parts.items())
    assert not any(name.startswith("encoder.layers.0.long_feed_forward.") for name in parts)  # inside the feed-forward
    backend = _attention_backend(model)
    attend = backend.attend
    hooks = lambda: sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
    before = hooks()
    with labelled(model):
        assert hooks() == before + 2 * len(parts)
        assert backend.attend is not attend
    assert hooks() == before and backend.attend is attend


def test_profile_refuses_plain_and_batched_in_one_line(capsys):
    from longdoc.cli import main

    for other in ("--plain", "--batched"):
        assert main(["bench", "--profile", other]) == 2
        assert capsys.readouterr().err == ("longdoc bench: error: --profile runs on its own: not with --plain or "
                                           "--batched\n")


def test_the_profilers_own_start_and_stop_lines_stay_off_stderr_and_other_lines_pass(capfd):
    # torch's profiler library writes "USDT:... profiler_start" / "profiler_stop" to the process's
    # stderr itself (torch 2.13): 4 lines a profiled step, before the table.
    settings = BenchSettings(shape=TINY, repeats=1, threads=1)
    run_profile(settings, LENGTH, profiled_variants(settings))
    assert "USDT:" not in capfd.readouterr().err
    with _without_profiler_trace_lines():
        os.write(2, b"USDT:2026-11-29 01:00:13 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a warning the user needs\n")
    assert capfd.readouterr().err == "a warning the user needs\n"


def test_each_model_and_mode_keeps_its_fastest_profiled_step(monkeypatch):
    # Steps disturbed by the heap's growth under the profiler are the slow ones: the fastest is kept.
    import longdoc.bench.profile as profile

    totals = iter([30.0, 10.0, 20.0] * 4)

    def fake_step(runner, mode):
        total = next(totals)
        return total, {part: total if part == GLUE else 0.0 for part in PARTS}, {part: 0.0 for part in PARTS}

    monkeypatch.setattr(profile, "profile_step", fake_step)
    settings = BenchSettings(shape=TINY, repeats=3, threads=1)
    steps = run_profile(settings, LENGTH, profiled_variants(settings))
    assert [(step.model, step.mode) for step in steps] == [(m, mode) for m in (REFERENCE.name, BERT) for mode in (FORWARD, TRAIN)]
    assert all(step.total_ms == 10.0 and step.parts_ms[GLUE] == 10.0 for step in steps)
