"""What a tuning pass will cost, from cluster.yaml alone: benchmark jobs per phase, wall time and node-seconds.

The jobs follow from the file the way the pass plans them: a search trial measures each weighted collective
at each rung of the size ladder (one job a rung, a spec per collective and size sweep) and may be pruned after
its first rung; a proof pair (one job) measures both sides over the weighted ladder, then the small sizes
``SMALL_RUNS - 1`` more times per side, for ``proofPairs`` to ``proofPairsMax`` pairs per finalist. The trials
the search adds after its budget (per-size options, the plugin table: as many as the data call for) are not
counted, so the search's figures are a floor for them. Wall time is the backend's recorded fixed cost
(``Backend.job_fixed_s``) times what pays it: a spec where the backend runs workers (each spec makes its own
rendezvous, in kept or new workers), a job on the sim backend; it is nearly all of the time at the pass's
sizes. Node-seconds are wall time times the nodes held. Non-goals: the probe round and the outputs (seconds),
and measuring anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from topo_tune.benchmark.job_spec import MAX_SPECS
from topo_tune.benchmark.sweep import size_ladder
from topo_tune.config.cluster import ClusterConfig
from topo_tune.nccl.backends import Backend
from topo_tune.tuner.objective import Objective, workload_profile
from topo_tune.tuner.proof import SMALL_RUNS, ProofSettings
from topo_tune.tuning_pass.job_evaluator import sweeps


@dataclass(frozen=True)
class PhaseEstimate:
    name: str
    jobs_low: int
    jobs_high: int
    specs_low: int
    specs_high: int
    note: str


@dataclass(frozen=True)
class PassEstimate:
    backend: Backend
    nodes: int
    phases: tuple[PhaseEstimate, ...]

    def lines(self) -> list[str]:
        """What ``init --dry-run`` prints: a line per phase and the total, saying where the figures come from."""
        fixed = self.backend.job_fixed_s
        low = sum(p.jobs_low for p in self.phases)
        high = sum(p.jobs_high for p in self.phases)
        specs = _count(sum(p.specs_low for p in self.phases), sum(p.specs_high for p in self.phases), "spec")
        out = [f"estimate for {self.nodes} nodes on the {self.backend} backend (nothing was started or drained):"]
        for phase in self.phases:
            jobs = _count(phase.jobs_low, phase.jobs_high, "job")
            out.append(f"  {phase.name}: {jobs} ({_count(phase.specs_low, phase.specs_high, 'spec')}); {phase.note}")
        if fixed is None:
            out.append(
                f"  total: {_count(low, high, 'job')} ({specs}); no fixed per-job cost is recorded for "
                f"{self.backend}: no time"
            )
            return out
        if self.backend.launches_workers:  # every spec makes its own rendezvous, in kept or new workers
            low = sum(p.specs_low for p in self.phases)
            high = sum(p.specs_high for p in self.phases)
            each = "a spec (each its own rendezvous)"
        else:
            each = "a job"
        wall = f"{_duration(low * fixed)} to {_duration(high * fixed)}"
        node_s = f"{low * fixed * self.nodes:.0f} to {high * fixed * self.nodes:.0f} node-seconds"
        jobs = _count(sum(p.jobs_low for p in self.phases), sum(p.jobs_high for p in self.phases), "job")
        out.append(f"  total: {jobs} ({specs}), {wall} wall, {node_s} (at {fixed:g} s {each})")
        return out


def estimate_pass(cluster: ClusterConfig) -> PassEstimate:
    """The pass ``init`` would run for ``cluster``, counted before anything starts."""
    search = cluster.search
    objective = Objective(workload_profile(cluster.workload))
    collectives = len(objective.collectives)
    ladder = size_ladder(min_bytes=search.min_bytes, max_bytes=search.max_bytes, step_factor=search.step_factor)
    rungs = objective.rungs(objective.weighted_sizes(ladder) or ladder, min(search.rungs, len(ladder)))
    per_rung = [collectives * len(sweeps(sizes)) for sizes in rungs]
    proof_sizes = objective.weighted_sizes(ladder)
    small = ProofSettings(sizes=proof_sizes, small_runs=SMALL_RUNS).small_sizes
    per_side = collectives * len(sweeps(proof_sizes)) + (SMALL_RUNS - 1) * collectives * len(
        sweeps(small) if small else []
    )
    per_pair = 2 * per_side
    pair_jobs = -(-per_pair // MAX_SPECS)
    pairs_max = max(search.proof_pairs_max, search.proof_pairs)
    rung_jobs = [-(-specs // MAX_SPECS) for specs in per_rung]
    return PassEstimate(
        backend=cluster.backend,
        nodes=len(cluster.rack_of()),
        phases=(
            PhaseEstimate(
                "search",
                search.budget * rung_jobs[0],
                search.budget * sum(rung_jobs),
                search.budget * per_rung[0],
                search.budget * sum(per_rung),
                f"budget {search.budget} trials x {_count(rung_jobs[0], sum(rung_jobs), 'job')} of "
                f"{_count(per_rung[0], sum(per_rung), 'spec')} (a job a rung: a trial pruned after its first rung, or "
                "measured at all rungs); the per-size and table trials after the budget not counted",
            ),
            PhaseEstimate(
                "proof",
                search.finalists * search.proof_pairs * pair_jobs,
                search.finalists * pairs_max * pair_jobs,
                search.finalists * search.proof_pairs * per_pair,
                search.finalists * pairs_max * per_pair,
                f"finalists {search.finalists} x {search.proof_pairs} to {pairs_max} pairs x "
                f"{_count(pair_jobs, pair_jobs, 'job')} of {per_pair} specs a pair (fewer specs once a collective's "
                "buckets are decided, or a finalist fails)",
            ),
        ),
    )


def _count(low: int, high: int, what: str) -> str:
    if low == high:
        return f"{low} {what}" + ("" if low == 1 else "s")
    return f"{low} to {high} {what}s"


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"
