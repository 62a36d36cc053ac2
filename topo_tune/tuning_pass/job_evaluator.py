"""Trials measured with benchmark jobs through the admin port: one job for all a call (or a proof pair) asks.

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

from topo_tune.benchmark.job_record import BenchmarkJob, BenchmarkRequest, JobStatus, NextSpecRequest, SizeRange
from topo_tune.benchmark.job_spec import MAX_SPECS
from topo_tune.benchmark.results import SizeMeasurement
from topo_tune.benchmark.sweep import size_ladder
from topo_tune.errors import NodeBusy, TrialFailed, ValidationError
from topo_tune.nccl.collectives import Collective
from topo_tune.tuner.objective import Measurements, SizeSample
from topo_tune.tuner.space import TrialConfig
from topo_tune.tuner.study import MeasurementRequest
from topo_tune.tuning_pass.controller_port import AdminPort


@dataclass(frozen=True)
class _Spec:
    """One spec of a job: a collective over one sweep, for one asked measurement (``index``)."""

    index: int
    config: TrialConfig
    collective: str
    sweep: SizeRange
    sim_seed: int | None


@dataclass
class JobEvaluator:
    """Measures trials with benchmark jobs through the admin API: everything one call asks for in one job.

    A call's collectives and sweeps are the specs of one job, and ``many`` (both arms of a proof pair, each
    arm's runs) puts several calls into one job, in the order asked: the agents run them back to back, and
    each spec's rows are that spec's alone, as if it had been a job of its own.
    """

    client: AdminPort
    deadline_s: float
    iters: int
    warmup_iters: int
    cuda_graph: bool = False
    sleep: Callable[[float], None] = time.sleep
    """Between attempts to start a job on nodes still busy with another one."""
    # The study's seed: each spec's sim noise seed is derived from it and from what the spec measures (trial,
    # purpose, pair, side, collective, sizes), never from a job id, the job it is in or the order jobs finish
    # in, so a seeded sim study reproduces exactly. None: the controller draws one per spec.
    seed: int | None = None
    on_job: Callable[[BenchmarkJob, float], None] | None = None
    """Told of each finished job with the seconds from asking for it to reading its result (cluster time)."""

    def __call__(self, config: TrialConfig, request: MeasurementRequest) -> Measurements:
        return self.many([(config, request)])[0]

    def many(self, asked: Sequence[tuple[TrialConfig, MeasurementRequest]]) -> list[Measurements]:
        """Each (config, request) measured, in order, in as few jobs as can hold them: one, unless the configs
        rank different node sets or there are more specs than a job may carry. A failed job fails them all
        (``TrialFailed``): a proof pair with a failed arm is no pair."""
        specs = [
            _Spec(index, config, collective, sweep, self._sim_seed(request, collective, sweep))
            for index, (config, request) in enumerate(asked)
            for collective in request.collectives
            for sweep in sweeps(request.sizes)
        ]
        samples: list[list[SizeSample]] = [[] for _ in asked]
        simulated = [False for _ in asked]
        for job_specs in _jobs(specs):
            job = self._run(job_specs)
            for place, spec in enumerate(job_specs):
                simulated[spec.index] = simulated[spec.index] or job.simulated
                samples[spec.index].extend(_samples(spec.collective, spec.sweep, job, spec=place))
        return [Measurements(tuple(s), simulated=sim) for s, sim in zip(samples, simulated, strict=True)]

    def _sim_seed(self, request: MeasurementRequest, collective: str, sweep: SizeRange) -> int | None:
        if self.seed is None:
            return None
        what = [self.seed, request.purpose, request.trial, request.repeat, request.side, collective]
        what += [sweep.min_bytes, sweep.max_bytes, sweep.step_factor]
        if request.run:
            what.append(request.run)
        return int.from_bytes(hashlib.sha256(json.dumps(what).encode()).digest()[:8], "big")

    def _run(self, specs: Sequence[_Spec]) -> BenchmarkJob:
        first = specs[0]
        request = BenchmarkRequest(
            collective=Collective(first.collective),
            nodes=tuple(first.config.rank_order.nodes),
            sizes=first.sweep,
            env=dict(first.config.env),
            iters=self.iters,
            warmup_iters=self.warmup_iters,
            # The job's deadline covers every spec in it, as the agents count it.
            deadline_s=math.ceil(self.deadline_s * len(specs)),
            tuner_table=first.config.tuner_table,
            cuda_graph=self.cuda_graph,
            sim_seed=first.sim_seed,
            next_specs=tuple(
                NextSpecRequest(
                    collective=Collective(spec.collective),
                    nodes=tuple(spec.config.rank_order.nodes),
                    sizes=spec.sweep,
                    env=dict(spec.config.env),
                    tuner_table=spec.config.tuner_table,
                    sim_seed=spec.sim_seed,
                )
                for spec in specs[1:]
            ),
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


def _jobs(specs: Sequence[_Spec]) -> list[list[_Spec]]:
    """The specs in order, cut into jobs: a new job where the node set changes or a job is full."""
    jobs: list[list[_Spec]] = []
    for spec in specs:
        current = jobs[-1] if jobs else None
        if (
            current is None
            or len(current) >= MAX_SPECS
            or set(current[0].config.rank_order.nodes) != set(spec.config.rank_order.nodes)
        ):
            jobs.append([spec])
        else:
            current.append(spec)
    return jobs


def sweeps(sizes: Sequence[int]) -> list[SizeRange]:
    """As few nccl-tests sweeps as cover ``sizes`` exactly: one when they form a geometric ladder."""
    ordered = sorted(set(sizes))
    if len(ordered) > 1:
        factor = ordered[1] // ordered[0]
        if factor >= 2 and all(b == a * factor for a, b in itertools.pairwise(ordered)):
            return [SizeRange(min_bytes=ordered[0], max_bytes=ordered[-1], step_factor=factor)]
    return [SizeRange(min_bytes=s, max_bytes=s, step_factor=1) for s in ordered]


def _samples(collective: str, sweep: SizeRange, job: BenchmarkJob, *, spec: int = 0) -> list[SizeSample]:
    """One sample per requested size of the job's spec ``spec``: the out-of-place row when there is one (torch
    runs some collectives in place only). Rows come back in size order, matched to the requested sizes in that
    order."""
    rows: dict[int, SizeMeasurement] = {}
    for row in (r for r in job.sizes if r.spec == spec):
        if row.bytes not in rows or not row.in_place:
            rows[row.bytes] = row
    requested = size_ladder(min_bytes=sweep.min_bytes, max_bytes=sweep.max_bytes, step_factor=sweep.step_factor)
    measured = [rows[b] for b in sorted(rows)]
    if len(measured) != len(requested):
        raise TrialFailed(
            f"job {job.job_id} measured {len(measured)} sizes of spec {spec}, {len(requested)} were asked",
            kind="failed",
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
