"""The encoder benchmark behind `longdoc bench` and scripts/bench_encoder.py.

Forward and forward+backward seconds and peak memory of GlobalLocalModel (residual attention and
talking heads on and off) next to transformers' Longformer, BigBird and BERT with the same shape,
all randomly initialised in the same run, plus the matmul GFLOP/s of the same machine and the
GFLOP/s our encoder achieves. Modules: settings (what is measured), models (building each model and
its inputs), worker (the fresh process that measures one job), memory (peak memory), flops (our
analytic FLOP count), run (one whole run), report (table and JSON). The project's own targets on
these figures are judged by scripts/bench_encoder.py (benchmarks/targets.py).
"""

from longdoc.bench.report import render_table, to_json
from longdoc.bench.run import run_benchmark
from longdoc.bench.settings import BenchSettings, Shape

__all__ = ["BenchSettings", "Shape", "render_table", "run_benchmark", "to_json"]
