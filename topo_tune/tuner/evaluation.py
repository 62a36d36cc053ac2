"""What a study asks its measurement for: the request, the evaluator protocol, and the failure it raises.

Purpose: the one interface between the tuner (search and proof) and whatever measures — real benchmark jobs
in the controller, the sim model in tests and benchmarks.

Non-goals: measuring anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from topo_tune.errors import FAILURE_KINDS, FailureKind, TrialFailed
from topo_tune.tuner.objective import Measurements
from topo_tune.tuner.space import TrialConfig

__all__ = [
    "FAILURE_KINDS",
    "BatchEvaluator",
    "Evaluator",
    "FailureKind",
    "MeasurementRequest",
    "TrialFailed",
    "measure_all",
    "requested",
]


@dataclass(frozen=True)
class MeasurementRequest:
    """What to measure for one call: collectives × sizes, for which trial and why."""

    collectives: tuple[str, ...]
    sizes: tuple[int, ...]
    trial: int  # the Optuna trial number the call measures (for a proof, the finalist's)
    purpose: Literal["search", "proof"]
    repeat: int = 0  # the pair index in a proof
    side: Literal["baseline", "candidate"] = "candidate"
    run: int = 0  # within a proof pair, the extra run of the small sizes (0: the pair's full-ladder run)


class Evaluator(Protocol):
    """Measures one configuration. Raises :class:`TrialFailed` (never anything else on purpose)."""

    def __call__(self, config: TrialConfig, request: MeasurementRequest) -> Measurements: ...


@runtime_checkable
class BatchEvaluator(Evaluator, Protocol):
    """An evaluator that can measure several (config, request)s in one go, in the order given (benchmark jobs:
    one job for all of them, so a proof pair's arms run back to back). A failure fails them all."""

    def many(self, asked: Sequence[tuple[TrialConfig, MeasurementRequest]]) -> list[Measurements]: ...


def measure_all(evaluate: Evaluator, asked: Sequence[tuple[TrialConfig, MeasurementRequest]]) -> list[Measurements]:
    """Each (config, request) measured in the order given: together where the evaluator can, else one by one."""
    if isinstance(evaluate, BatchEvaluator):
        return evaluate.many(asked)
    return [evaluate(config, request) for config, request in asked]


def requested(got: Measurements, request: MeasurementRequest) -> Measurements:
    """The samples the request asked for; a missing one fails the trial (a benchmark that skipped sizes)."""
    missing = [(c, s) for c in request.collectives for s in request.sizes if got.get(c, s) is None]
    if missing:
        c, s = missing[0]
        raise TrialFailed(f"the benchmark reported no result for {c} at {s} bytes ({len(missing)} missing)")
    wanted = {(c, s) for c in request.collectives for s in request.sizes}
    return Measurements(tuple(s for s in got.samples if (s.collective, s.bytes) in wanted), simulated=got.simulated)
