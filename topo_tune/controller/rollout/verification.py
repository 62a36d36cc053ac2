"""A wave's A/B verification: benchmark jobs on the wave's nodes, the new and the previous version interleaved.

Each repeat runs two benchmark jobs over all of the wave's nodes, one per version, and alternates which goes
first (ABBA...), so drift in the fabric hits both arms alike. A version is its settings and its node order, so
each arm's jobs place their ranks in that version's order of the wave's nodes (``wave_order``: its ring
re-planned over them, as ``tuner.job_order`` plans any job's nodes; the launcher's order, sorted host names,
for NCCL's defaults or a version without a rank map), the order a job on those nodes is given: a version
whose order is worse than the stable one's is measured slower and fails the gate, even with the same
settings. A job selects its version's settings through
``NCCL_CONF_FILE`` pointing at that version's staged ``nccl.conf`` (unset for NCCL's defaults: the agents'
env policy admits files inside their config directory only), the same file a pinned job reads; every agent
keeps the previous version staged next to the active one. A version with a tuner-plugin table
(``nccl_tuner.conf``) also sends that table with its jobs, and each agent loads it through its plugin, as a
job under ``topo-tune exec`` would: the gate measures the per-size choices too, not only the environment.
A repeat becomes one A/B pair of samples: the
sweep's total time, its worst p99 and the bus bandwidth at its largest size. A repeat in which either job
failed gives no pair (fewer pairs make the gate inconclusive, never successful).

Non-goals: judging (``gates.py``) and dispatching jobs (``controller/benchmarks/service.py``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from topo_tune.benchmark.job_record import BenchmarkJob, BenchmarkRequest, JobStatus, SizeRange
from topo_tune.config.cluster import RolloutGateConfig
from topo_tune.controller.rollout.gate_run import GateRun
from topo_tune.controller.rollout.gates import Sample
from topo_tune.errors import ConflictError
from topo_tune.ids import ConfigVersionId
from topo_tune.nccl.collectives import Collective
from topo_tune.tuner.ring.job_order import job_order
from topo_tune.versions.layout import DEFAULT_CONFIG_DIR, staged_path
from topo_tune.versions.version import NCCL_CONF, RANK_MAP

logger = logging.getLogger(__name__)


class JobRunner(Protocol):
    """What the verifier needs of the controller's benchmark jobs."""

    async def start(self, request: BenchmarkRequest) -> BenchmarkJob: ...

    async def wait(self, job_id: str) -> BenchmarkJob:
        """The job once it has ended (woken where its end is committed)."""


@dataclass
class BenchmarkVerifier:
    jobs: JobRunner
    config_dir: Path = DEFAULT_CONFIG_DIR
    """The agents' config directory (the same on every node)."""
    collective: Collective = Collective.ALL_REDUCE
    deadline_s: int = 600
    tables: Callable[[ConfigVersionId], Awaitable[str]] | None = None
    """A version's tuner-plugin table ("" when it has none); None: gates send no table."""
    orders: Callable[[ConfigVersionId, Sequence[str]], Awaitable[tuple[str, ...]]] | None = None
    """A version's order of the given nodes ("": NCCL's defaults); None: both arms run in the wave's order."""

    def env_for(self, version: ConfigVersionId) -> dict[str, str]:
        """The job environment that selects ``version``; NCCL's defaults: no file of ours at all."""
        return {"NCCL_CONF_FILE": str(staged_path(self.config_dir, version, NCCL_CONF))} if version else {}

    async def order_of(self, version: ConfigVersionId, nodes: Sequence[str]) -> tuple[str, ...]:
        """The rank order of ``nodes`` that ``version``'s jobs run in."""
        return tuple(nodes) if self.orders is None else await self.orders(version, nodes)

    async def verify(self, run: GateRun) -> Sequence[Sample]:
        """The A/B samples of the wave's repeats; ``ConflictError`` with the first job's failure when every
        repeat failed, so the cause (not only "0 A/B pairs") is in the gate's verdict and the rollout's reason."""
        samples: list[Sample] = []
        failures: list[str] = []
        versions = {"new": run.new, "previous": run.previous}
        orders = {arm: await self.order_of(version, run.nodes) for arm, version in versions.items()}
        logger.info(
            "gate orders: new %s, previous %s",
            ",".join(orders["new"]),
            ",".join(orders["previous"]),
            extra={"rollout": run.rollout_id, "wave": run.wave},
        )
        for repeat in range(run.measurement.repeats):
            arms = ("new", "previous") if repeat % 2 == 0 else ("previous", "new")
            measured: dict[str, Sample] = {}
            for arm in arms:
                version = versions[arm]
                job_id = gate_job_id(run.rollout_id, wave=run.wave, attempt=run.attempt, repeat=repeat, arm=arm)
                job = await self.run_job(job_id, orders[arm], version, measurement=run.measurement)
                sample = job_sample(job, repeat=repeat, arm=arm)
                if sample is None:
                    logger.warning(
                        "gate job %s gave no usable result: %s",
                        job.job_id,
                        job.message,
                        extra={"rollout": run.rollout_id, "wave": run.wave},
                    )
                    failures.append(job.message or f"job {job.job_id} {job.status.value}")
                    break
                measured[arm] = sample
            if len(measured) == 2:
                samples.extend(measured[arm] for arm in arms)
        if failures and not samples:
            raise ConflictError(f"every gate job failed, e.g. {failures[0]}{self._hint(failures[0])}")
        return samples

    def _hint(self, failure: str) -> str:
        if "NCCL_CONF_FILE" not in failure:
            return ""
        return (
            f" (gate jobs read each version from {self.config_dir}, the controller's rollout.agentConfigDir: "
            "set it in the controller's cluster.yaml to the agents' --config-dir)"
        )

    async def run_job(
        self, job_id: str, nodes: Sequence[str], version: ConfigVersionId, *, measurement: RolloutGateConfig
    ) -> BenchmarkJob:
        """Run the verification benchmark (as ``measurement`` says) with ``version`` on ``nodes`` (in rank order)
        under ``job_id``; wait for its end.

        A job id that exists already is not started again: its stored outcome is awaited instead.
        """
        request = BenchmarkRequest(
            collective=self.collective,
            nodes=tuple(nodes),
            sizes=SizeRange(measurement.min_bytes, measurement.max_bytes, measurement.step_factor),
            iters=measurement.iters,
            warmup_iters=measurement.warmup_iters,
            cuda_graph=measurement.cuda_graph,
            env=self.env_for(version),
            deadline_s=self.deadline_s,
            job_id=job_id,
            tuner_table=await self.tables(version) if self.tables is not None and version else "",
        )
        job = await self.jobs.start(request)
        if job.status.final:
            return job
        return await self.jobs.wait(job_id)


def wave_order(files: Mapping[str, str], nodes: Sequence[str], *, version: str) -> tuple[str, ...]:
    """The rank order of ``nodes`` for a job given ``version``, whose files are ``files`` ("" and {}: NCCL's
    defaults): the order a job on exactly these nodes is handed (``tuner.job_order``: the version's ring
    re-planned over them on its pair matrix, never worse there than the launcher's order; the launcher's
    order, sorted host names, without a rank map). ``ValidationError`` names the field of a malformed map."""
    answer = job_order(files.get(RANK_MAP), nodes, version=version)
    for warning in answer.warnings:
        logger.warning("gate order of %s: %s", version or "defaults", warning)
    return answer.order


def gate_job_id(rollout_id: str, *, wave: int, attempt: int, repeat: int, arm: str) -> str:
    """The benchmark job of one arm of one gate repeat.

    Stable, so that a controller resuming mid-gate finds the job, and so that the jobs behind a stored gate
    sample can be named (retention keeps them).
    """
    key = f"{rollout_id}/{wave}/{attempt}/{repeat}/{arm}"
    return "gate-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def job_sample(job: BenchmarkJob, *, repeat: int, arm: str) -> Sample | None:
    """One sample of a finished verification job (None when it failed or measured nothing)."""
    # Out of place where the job measured it; gloo runs all_reduce in place only.
    rows = [r for r in job.sizes if not r.in_place] or list(job.sizes)
    if job.status is not JobStatus.SUCCEEDED or not rows:
        return None
    largest = max(rows, key=lambda r: r.bytes)
    return Sample(
        repeat=repeat,
        arm=arm,
        time_us=sum(r.time_us for r in rows),
        p99_us=max(r.p99_us or r.time_us for r in rows),
        busbw_gbps=largest.busbw_gbps,
    )
