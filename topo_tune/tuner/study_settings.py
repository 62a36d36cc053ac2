"""How a study runs: its settings, checked once, with cluster.yaml's ``search`` defaults written once there.

Non-goals: running the study (``study``), reading cluster.yaml (``cluster_config``).
"""

from __future__ import annotations

from dataclasses import dataclass

from topo_tune.config.checks import naming_fields
from topo_tune.config.cluster import SearchConfig
from topo_tune.errors import ConfigError
from topo_tune.tuner import statistics
from topo_tune.tuner.objective import DEFAULT_LADDER
from topo_tune.tuner.samplers import SamplerName

__all__ = ["StudySettings"]

_SEARCH = SearchConfig()
"""cluster.yaml's ``search`` defaults: the study's, written once there."""
_FROM_SEARCH = (
    "budget",
    "sampler",
    "seed",
    "rungs",
    "finalists",
    "proof_pairs",
    "proof_pairs_max",
    "min_effect",
    "max_loss",
)


@dataclass(frozen=True)
class StudySettings:
    """How a study runs. ``worker_id`` must be unique among live processes; a restart may reuse it."""

    name: str
    storage: str  # SQLAlchemy URL: sqlite:///… embedded, postgresql+psycopg://… in production
    budget: int = _SEARCH.budget
    sampler: SamplerName = _SEARCH.sampler
    seed: int = _SEARCH.seed
    ladder: tuple[int, ...] = DEFAULT_LADDER
    rungs: int = _SEARCH.rungs
    prune_ratio: float = 0.8  # prune below this fraction of the best completed value at a rung; 0: never
    prune_startup: int = 5  # completed trials needed before pruning starts
    # TPE models the landscape from the third finished trial on (the baseline and the candidates count), and
    # picks each proposal from 64 draws of its model. Optuna's defaults (10 random start-up trials, 24 draws)
    # suit a study that knows nothing; here the baseline and the topology-derived candidates are measured
    # first, and 10 random trials would spend a quarter of a 40-trial budget ignoring them
    # (benchmarks/search_efficiency.py measures both).
    tpe_startup: int = 3
    tpe_ei_candidates: int = 64
    finalists: int = _SEARCH.finalists
    proof_pairs: int = _SEARCH.proof_pairs
    proof_pairs_max: int = _SEARCH.proof_pairs_max
    """Pairs a finalist may get in all (looks of ``proof_pairs``) while a weighted bucket is undecided."""
    alpha: float = statistics.DEFAULT_ALPHA
    min_effect: float = _SEARCH.min_effect
    max_loss: float = _SEARCH.max_loss
    """The largest loss a shipped configuration may have in any weighted bucket (at its lower bound)."""
    worker_id: str = "topo-tune"
    table_shape: tuple[int, int] | None = None
    """(nNodes, nRanks) of the job's communicator: after the search, compose a tuner-plugin table from the
    per-bucket winners and measure it as one more trial (``plugin_table``); None: no table trial."""
    heartbeat_interval_s: float = 10.0
    stale_after_s: float = 60.0
    poll_interval_s: float = 1.0

    def __post_init__(self) -> None:
        with naming_fields(where="study", error=ConfigError):  # the settings cluster.yaml's search has: its checks
            SearchConfig.model_validate({name: getattr(self, name) for name in _FROM_SEARCH})
        checks: list[tuple[str, bool, str]] = [
            ("name", bool(self.name), "must not be empty"),
            ("storage", "://" in self.storage, f"expected a SQLAlchemy URL, got {self.storage!r}"),
            ("tpe_startup", self.tpe_startup >= 0, f"must be >= 0, got {self.tpe_startup}"),
            ("tpe_ei_candidates", self.tpe_ei_candidates >= 1, f"must be at least 1, got {self.tpe_ei_candidates}"),
            ("prune_ratio", 0 <= self.prune_ratio < 1, f"must be within [0, 1), got {self.prune_ratio}"),
            (
                "proof_pairs_max",
                self.proof_pairs_max >= self.proof_pairs,
                f"must be at least proof_pairs ({self.proof_pairs}), got {self.proof_pairs_max}",
            ),
            ("heartbeat_interval_s", self.heartbeat_interval_s > 0, "must be > 0"),
            (
                "stale_after_s",
                self.stale_after_s > self.heartbeat_interval_s,
                "must be longer than heartbeat_interval_s",
            ),
        ]
        for name, ok, reason in checks:
            if not ok:
                raise ConfigError(f"study.{name}", reason)
