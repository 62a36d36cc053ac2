"""Timeout advice: a process-group timeout and PyTorch watchdog settings fitted to measured latencies.

Purpose: there is no ``NCCL_TIMEOUT`` (not in NCCL's source or env.rst); collective timeouts belong to the framework
(``init_process_group(timeout=…)``, 10 min by default for NCCL) and to PyTorch's ``TORCH_NCCL_*`` watchdog.
From the measured per-collective times (many trials and proof repeats) this fits a Gamma distribution per
collective, takes its 99.5th percentile, scales it by a safety multiplier (jobs run larger collectives and
meet stragglers the benchmark did not) and never goes below a floor. The answer is advice written into the
summary, not a setting topo-tune applies.

Non-goals: detecting hangs, or per-job timeouts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from topo_tune.errors import ConfigError
from topo_tune.tuner.objective import Measurements
from topo_tune.tuner.study import StudyOutcome

__all__ = ["CollectiveLatency", "TimeoutAdvice", "advise", "fit_latency", "latencies_of"]

DEFAULT_FLOOR_S = 300.0
DEFAULT_MULTIPLIER = 1000.0
QUANTILE = 0.995
MIN_SAMPLES = 5
"""Fewer measurements of a collective give no fit (and no advice for it)."""


@dataclass(frozen=True)
class CollectiveLatency:
    collective: str
    samples: int
    shape: float  # Gamma shape (k); scale in µs
    scale_us: float
    p995_us: float


@dataclass(frozen=True)
class TimeoutAdvice:
    """The recommended process-group timeout and watchdog environment, with the fits behind it."""

    process_group_timeout_s: float
    env: Mapping[str, str]
    fits: tuple[CollectiveLatency, ...]
    floor_s: float
    multiplier: float

    def to_json(self) -> dict[str, object]:
        return {
            "process_group_timeout_s": self.process_group_timeout_s,
            "init_process_group": f"timeout=datetime.timedelta(seconds={int(self.process_group_timeout_s)})",
            "env": dict(self.env),
            "note": "NCCL has no NCCL_TIMEOUT; the timeout belongs to torch.distributed and its watchdog",
            "floor_s": self.floor_s,
            "multiplier": self.multiplier,
            "fits": [
                {
                    "collective": f.collective,
                    "samples": f.samples,
                    "gamma_shape": f.shape,
                    "gamma_scale_us": f.scale_us,
                    "p99_5_us": f.p995_us,
                }
                for f in self.fits
            ],
        }


def fit_latency(collective: str, times_us: Sequence[float]) -> CollectiveLatency:
    """A Gamma fit (location 0) of one collective's times and its 99.5th percentile."""
    if len(times_us) < MIN_SAMPLES:
        raise ConfigError(f"latencies.{collective}", f"needs at least {MIN_SAMPLES} samples, got {len(times_us)}")
    bad = [t for t in times_us if not (t > 0 and math.isfinite(t))]
    if bad:
        raise ConfigError(f"latencies.{collective}", f"times must be finite and > 0, got {bad[0]!r}")
    if max(times_us) == min(times_us):
        # A degenerate (deterministic) sample: the fit is undefined, the percentile is the value itself.
        return CollectiveLatency(collective, len(times_us), math.inf, 0.0, float(times_us[0]))
    from scipy import stats  # noqa: PLC0415 - SciPy's stats take a second to load; the controller loads this module on every start

    shape, _, scale = stats.gamma.fit(list(times_us), floc=0.0)
    p995 = float(stats.gamma.ppf(QUANTILE, shape, loc=0.0, scale=scale))
    return CollectiveLatency(collective, len(times_us), float(shape), float(scale), p995)


def latencies_of(outcome: StudyOutcome) -> dict[str, list[float]]:
    """Per collective, the times of its largest measured size in every complete trial and proof run."""
    runs: list[Measurements] = [t.measurements for t in outcome.trials if t.state == "complete" and t.measurements]
    for proof in outcome.proofs:
        runs.extend(m for m in (proof.baseline, proof.candidate) if m is not None)
    largest: dict[str, int] = {}
    for run in runs:
        for s in run.samples:
            largest[s.collective] = max(largest.get(s.collective, 0), s.bytes)
    return {
        c: [sample.time_us for run in runs if (sample := run.get(c, size)) is not None]
        for c, size in sorted(largest.items())
    }


def advise(
    latencies_us: Mapping[str, Sequence[float]],
    *,
    floor_s: float = DEFAULT_FLOOR_S,
    multiplier: float = DEFAULT_MULTIPLIER,
) -> TimeoutAdvice:
    """Advice from per-collective times in µs (e.g. the largest size of every measurement)."""
    if floor_s <= 0:
        raise ConfigError("floor_s", f"must be > 0, got {floor_s}")
    if multiplier < 1:
        raise ConfigError("multiplier", f"must be >= 1, got {multiplier}")
    if not latencies_us:
        raise ConfigError("latencies", "needs at least one collective")
    fits = tuple(fit_latency(c, times) for c, times in sorted(latencies_us.items()))
    worst_s = max(f.p995_us for f in fits) * 1e-6
    timeout = max(floor_s, math.ceil(worst_s * multiplier / 60.0) * 60.0)
    env = {
        # 3 (PyTorch's default): on a timeout, tear the process down without ncclCommAbort, which can hang.
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_ENABLE_MONITORING": "1",
        # The heartbeat monitor kills a wedged watchdog; it must outlast one whole collective timeout.
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(int(max(480.0, timeout + 60.0))),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    }
    return TimeoutAdvice(timeout, env, fits, floor_s, multiplier)
