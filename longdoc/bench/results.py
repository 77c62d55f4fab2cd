"""What one benchmark run measured: per-job timings and peak memory, the matmul baseline, the machine."""

import statistics
from dataclasses import asdict, dataclass, field

from longdoc.bench.settings import BenchSettings


@dataclass(frozen=True)
class Measurement:
    """One (model, length, mode): seconds of each timed repeat (after one warm-up) and peak MiB.

    `flops` is the analytic matmul FLOP count of one forward pass (our encoder only); `error` is the
    measuring process's last error line when it failed, and then nothing else is filled.
    """

    model: str
    length: int
    mode: str
    seconds: list = field(default_factory=list)
    peak_mib: float | None = None
    flops: int | None = None
    error: str | None = None

    @property
    def median_seconds(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    @property
    def gflops(self) -> float | None:
        """Achieved GFLOP/s: the analytic FLOP count over the median time."""
        return self.flops / self.median_seconds / 1e9 if self.flops and self.seconds else None

    def to_dict(self) -> dict:
        return {**asdict(self), "median_seconds": self.median_seconds, "gflops": self.gflops}

    @classmethod
    def from_dict(cls, data: dict) -> "Measurement":
        return cls(**{key: value for key, value in data.items() if key not in ("median_seconds", "gflops")})


@dataclass(frozen=True)
class MatmulMeasurement:
    """The machine's matmul speed in the same run: an n x n by n x n product, 2 n^3 FLOPs, on the
    backend our linear layers use (longdoc.model.linear.backend(): "onednn" or "blas")."""

    size: int
    dtype: str
    seconds: list
    threads: int
    backend: str

    @property
    def gflops(self) -> float:
        return 2 * self.size**3 / statistics.median(self.seconds) / 1e9

    def to_dict(self) -> dict:
        return {**asdict(self), "gflops": self.gflops}

    @classmethod
    def from_dict(cls, data: dict) -> "MatmulMeasurement":
        return cls(**{key: value for key, value in data.items() if key != "gflops"})


@dataclass(frozen=True)
class BenchResult:
    settings: BenchSettings
    machine: dict
    matmul: MatmulMeasurement
    measurements: list

    def find(self, model: str, length: int, mode: str) -> Measurement | None:
        """The successful measurement of (model, length, mode), or None."""
        for measurement in self.measurements:
            if (measurement.model, measurement.length, measurement.mode) == (model, length, mode):
                return None if measurement.error else measurement
        return None
