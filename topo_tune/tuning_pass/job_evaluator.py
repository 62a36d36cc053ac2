"""A trial measured with benchmark jobs through the admin port: one job per collective and size sweep.

Each job's sim noise seed is derived from the study's seed and what the job measures, so a seeded sim study
reproduces exactly. Non-goals: choosing what to measure (the study does) and judging it (the proof does).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from topo_tune.benchmark.job_record import BenchmarkJob, BenchmarkRequest, JobStatus, SizeRange
from topo_tune.benchmark.results import SizeMeasurement
from topo_tune.benchmark.sweep import size_ladder
from topo_tune.errors import NodeBusy, TrialFailed, ValidationError
from topo_tune.nccl.collectives import Collective
from topo_tune.tuner.objective import Measurements, SizeSample
from topo_tune.tuner.space import TrialConfig
from topo_tune.tuner.study import MeasurementRequest
from topo_tune.tuning_pass.controller_port import AdminPort


@dataclass
class JobEvaluator:
    """Measures a trial with benchmark jobs through the admin API: one job per collective."""

    client: AdminPort
    deadline_s: float
    iters: int
    warmup_iters: int
    cuda_graph: bool = False
    sleep: Callable[[float], None] = time.sleep
    """Between attempts to start a job on nodes still busy with another one."""
    # The study's seed: each job's sim noise seed is derived from it and from what the job measures (trial,
    # purpose, pair, side, collective, sizes), never from a job id or the order jobs finish in, so a seeded sim
    # study reproduces exactly. None: the controller draws one per job.
    seed: int | None = None
    on_job: Callable[[BenchmarkJob, float], None] | None = None
    """Told of each finished job with the seconds from asking for it to reading its result (cluster time)."""

    def __call__(self, config: TrialConfig, request: MeasurementRequest) -> Measurements:
        samples: list[SizeSample] = []
        simulated = False
        for collective in request.collectives:
            for sweep in sweeps(request.sizes):
                job = self._run(collective, sweep, config, self._sim_seed(request, collective, sweep))
                simulated = simulated or job.simulated
                samples.extend(_samples(collective, sweep, job))
        return Measurements(tuple(samples), simulated=simulated)

    def _sim_seed(self, request: MeasurementRequest, collective: str, sweep: SizeRange) -> int | None:
        if self.seed is None:
            return None
        what = [self.seed, request.purpose, request.trial, request.repeat, request.side, collective]
        what += [sweep.min_bytes, sweep.max_bytes, sweep.step_factor]
        if request.run:
            what.append(request.run)
        return int.from_bytes(hashlib.sha256(json.dumps(what).encode()).digest()[:8], "big")

    def _run(self, collective: str, sweep: SizeRange, config: TrialConfig, sim_seed: int | None = None) -> BenchmarkJob:
        request = BenchmarkRequest(
            collective=Collective(collective),
            nodes=tuple(config.rank_order.nodes),
            sizes=sweep,
            env=dict(config.env),
            iters=self.iters,
            warmup_iters=self.warmup_iters,
            deadline_s=math.ceil(self.deadline_s),
            tuner_table=config.tuner_table,
            cuda_graph=self.cuda_graph,
            sim_seed=sim_seed,
        )
        # A node still busy with an earlier job (e.g. one left by a run that was killed and is being resumed)
        # frees up when that job ends or reaches its deadline: wait for it rather than fail the trial.
        asked = time.monotonic()
        waited_until = asked + self.deadline_s
        while True:
            try:
                job = self.client.start_benchmark(request)
                break
            except NodeBusy as busy:
                if time.monotonic() > waited_until:
                    raise TrialFailed(str(busy), kind="timeout") from None
                self.sleep(0.5)
            except ValidationError as refused:
                # The controller refused this trial's job (a setting its nodes cannot run): the trial fails
                # with the controller's reason, the study goes on.
                raise TrialFailed(str(refused), kind="failed") from None
        if job.status is JobStatus.RUNNING:
            job = self.client.wait_benchmark(job.job_id)
        if self.on_job is not None:
            self.on_job(job, time.monotonic() - asked)
        if job.status is JobStatus.TIMED_OUT:
            raise TrialFailed(job.message, kind="timeout")
        if job.status is not JobStatus.SUCCEEDED:
            wrong = any(s.wrong for s in job.sizes)
            raise TrialFailed(job.message, kind="wrong_result" if wrong else "failed")
        return job


def sweeps(sizes: Sequence[int]) -> list[SizeRange]:
    """As few nccl-tests sweeps as cover ``sizes`` exactly: one when they form a geometric ladder."""
    ordered = sorted(set(sizes))
    if len(ordered) > 1:
        factor = ordered[1] // ordered[0]
        if factor >= 2 and all(b == a * factor for a, b in itertools.pairwise(ordered)):
            return [SizeRange(min_bytes=ordered[0], max_bytes=ordered[-1], step_factor=factor)]
    return [SizeRange(min_bytes=s, max_bytes=s, step_factor=1) for s in ordered]


def _samples(collective: str, sweep: SizeRange, job: BenchmarkJob) -> list[SizeSample]:
    """One sample per requested size: the out-of-place row when there is one (torch runs some collectives
    in place only). Rows come back in size order, matched to the requested sizes in that order."""
    rows: dict[int, SizeMeasurement] = {}
    for row in job.sizes:
        if row.bytes not in rows or not row.in_place:
            rows[row.bytes] = row
    requested = size_ladder(min_bytes=sweep.min_bytes, max_bytes=sweep.max_bytes, step_factor=sweep.step_factor)
    measured = [rows[b] for b in sorted(rows)]
    if len(measured) != len(requested):
        raise TrialFailed(
            f"job {job.job_id} measured {len(measured)} sizes, {len(requested)} were asked", kind="failed"
        )
    return [_sample(collective, size, row) for size, row in zip(requested, measured, strict=True)]


def _sample(collective: str, size: int, row: SizeMeasurement) -> SizeSample:
    """One size, with what NCCL offered and ran there when the backend reported it (tuner-table names)."""
    choice = row.choice
    if choice is None:
        return SizeSample(collective, size, row.time_us, row.busbw_gbps, "", "", 0)
    algorithm, _, protocol = choice.applied.partition("/")
    return SizeSample(
        collective,
        size,
        row.time_us,
        row.busbw_gbps,
        algorithm,
        protocol,
        choice.channels,
        tuple(choice.offered),
        choice.nccl,
    )
