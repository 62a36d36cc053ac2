"""The cluster time a tuning pass takes: wall time and node-seconds per phase, and how much of the benchmark jobs'
time was fixed per-job cost rather than collectives running.

Every node the pass tunes is held for it from the first probe to the end of the proof, so a phase's node-seconds
are its wall time times the nodes held. A job's collective time is what its rows say the timed and warm-up loops
took (``time_us`` × iterations); the rest of the job's round trip (the controller's commits, the commands'
delivery, starting workers, the agents' journals) is its fixed cost. On the ``sim`` backend the collectives are
modelled, not run: their time is SIMULATED and takes no wall time, so every second of a sim job is fixed cost.
Non-goals: estimating a pass before it runs, and the controller's own accounting of its jobs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from topo_tune.benchmark.job_record import BenchmarkJob


@dataclass
class PhaseTime:
    name: str
    nodes: int
    """Nodes held for the pass during this phase."""
    wall_s: float = 0.0
    jobs: int = 0
    job_wall_s: float = 0.0
    """Wall time from asking for each job to reading its result, summed over the phase's jobs."""
    collective_s: float = 0.0
    """What the jobs' rows say their collectives took (modelled on the sim backend)."""

    @property
    def node_s(self) -> float:
        return self.wall_s * self.nodes

    @property
    def fixed_s(self) -> float:
        """Job time that was not collectives running: all of it where the collectives were simulated."""
        return max(0.0, self.job_wall_s - self.collective_s)


def collective_seconds(job: BenchmarkJob) -> float:
    """The time a job's timed and warm-up loops took, by its own rows."""
    loops = job.iters + job.warmup_iters
    return sum(row.time_us for row in job.sizes) * loops / 1e6


@dataclass
class ClusterClock:
    """Phases in the order the pass runs them; ``begin`` ends the running one."""

    simulated: bool
    clock: Callable[[], float] = time.monotonic
    phases: list[PhaseTime] = field(default_factory=list)
    _started: float | None = None

    def begin(self, name: str, *, nodes: int) -> None:
        self.end()
        self.phases.append(PhaseTime(name, nodes))
        self._started = self.clock()

    def end(self) -> None:
        if self._started is not None and self.phases:
            self.phases[-1].wall_s += self.clock() - self._started
        self._started = None

    @property
    def current(self) -> str | None:
        return self.phases[-1].name if self.phases and self._started is not None else None

    def job(self, job: BenchmarkJob, *, wall_s: float) -> None:
        """One finished job of the running phase."""
        if not self.phases:
            return
        phase = self.phases[-1]
        phase.jobs += 1
        phase.job_wall_s += wall_s
        # A simulated job's collectives took no wall time: its whole round trip is fixed cost.
        phase.collective_s += 0.0 if job.simulated else collective_seconds(job)

    def to_json(self) -> dict[str, Any]:
        """``summary.json``'s ``cluster_time``: the phases so far (the running one up to now)."""
        running = self.clock() - self._started if self._started is not None else 0.0
        rows: list[dict[str, Any]] = []
        for i, p in enumerate(self.phases):
            wall = p.wall_s + (running if i == len(self.phases) - 1 else 0.0)
            rows.append(
                {
                    "phase": p.name,
                    "wall_s": round(wall, 3),
                    "nodes": p.nodes,
                    "node_s": round(wall * p.nodes, 3),
                    "jobs": p.jobs,
                    "job_wall_s": round(p.job_wall_s, 3),
                    "job_fixed_s": round(p.fixed_s, 3),
                    "collective_s": round(p.collective_s, 6),
                }
            )
        return {
            "phases": rows,
            "wall_s": round(sum(r["wall_s"] for r in rows), 3),
            "node_s": round(sum(r["node_s"] for r in rows), 3),
            "simulated": self.simulated,
            "note": (
                "SIMULATED collectives: they take no wall time, so each sim job's time is all fixed cost"
                if self.simulated
                else "collective_s is what the jobs' rows say their timed and warm-up loops took"
            ),
        }


def time_lines(data: dict[str, Any]) -> list[str]:
    """``init``'s closing lines: a line per phase and the total."""
    lines = []
    for row in data["phases"]:
        jobs = ""
        if row["jobs"]:
            per_job = row["job_fixed_s"] / row["jobs"]
            counted = f"{row['jobs']} job" + ("" if row["jobs"] == 1 else "s")
            jobs = f"; {counted}, {row['job_fixed_s']:.1f} s of it fixed per-job cost ({per_job:.2f} s a job)"
        lines.append(f"  {row['phase']}: {row['wall_s']:.1f} s, {row['node_s']:.0f} node-s{jobs}")
    simulated = " (collectives SIMULATED: no wall time of their own)" if data["simulated"] else ""
    head = f"cluster time: {data['wall_s']:.1f} s wall, {data['node_s']:.0f} node-seconds{simulated}"
    return [head, *lines]
