"""Timed training runs behind scripts/bench_multihop.py: `longdoc train` stopped after a number of
training minutes, with the learning curve of its evaluations."""

import sys
from dataclasses import dataclass
from pathlib import Path

from longdoc.errors import OptionError


@dataclass
class CurvePoint:
    """One evaluation of a timed run: after `step` optimizer steps and `minutes` of training
    (evaluation time excluded), the official metrics on the dev file."""

    step: int
    minutes: float
    metrics: dict[str, float]


def timed_training(task, options, task_options, minutes: float) -> list[CurvePoint]:
    """`longdoc train` of `task` with resolved `options` and `task_options` (evaluating every `eval_steps`) stopped
    after `minutes` of training time, or at `max_steps`, whichever comes first; the learning curve.

    The engine's own job and loop (`build_task_job`, `run_training`): its evaluation is wrapped to
    take the clock out while it runs, and the time limit asks the loop to stop the way Ctrl-C does
    (SIGTERM: the step in flight finishes and a checkpoint is written), then the stopped model is
    evaluated once more (that last point's minutes include writing the stop checkpoint). The clock
    starts at the first training batch (model loading excluded)."""
    import os
    import signal
    import time

    import torch

    from longdoc.train.engine import run_training
    from longdoc.train.finetune import build_task_job

    out = Path(options.out)
    if (out / "checkpoints").exists():
        raise OptionError("{out} {path} holds checkpoints of an earlier run: a timed run starts afresh; give another "
                          "{out}", path=out)
    job = build_task_job(task, options, task_options)
    evaluate, collate = job.evaluate, job.collate
    clock = {"start": None, "evaluating": 0.0, "batches": 0, "stopping": False}
    points: list[CurvePoint] = []

    def training_minutes() -> float:
        return (time.perf_counter() - clock["start"] - clock["evaluating"]) / 60

    def timed_evaluate(model, folder: Path) -> dict[str, float]:
        began = time.perf_counter()
        at = CurvePoint(clock["batches"] // options.grad_accum, training_minutes(), {})
        at.metrics = evaluate(model, folder)
        clock["evaluating"] += time.perf_counter() - began
        points.append(at)
        print(f"longdoc: {task.name} after {at.step} steps, {at.minutes:.1f} training minutes: answer F1 "
              f"{at.metrics.get('f1', float('nan')):.4f}", file=sys.stderr)
        return at.metrics

    def counted_collate(rows):
        if clock["start"] is None:
            clock["start"] = time.perf_counter()
        clock["batches"] += 1
        if not clock["stopping"] and training_minutes() >= minutes:
            clock["stopping"] = True
            print(f"longdoc: {minutes:g} training minutes reached: stopping", file=sys.stderr)
            os.kill(os.getpid(), signal.SIGTERM)
        return collate(rows)

    job.evaluate, job.collate = timed_evaluate, counted_collate
    result = run_training(job)
    if result.interrupted and clock["stopping"]:
        job.model.eval()
        with torch.no_grad():
            timed_evaluate(job.model, out)
    elif result.interrupted:
        raise KeyboardInterrupt
    return points
