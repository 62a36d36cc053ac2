"""The admin API's watch streams: one job, probe round, drift check, rollout or study, from now until it ends.

Each stream sends the state now, then again each time the controller commits a change to it (the services
wake it: `topo_tune.controller.changes`), and ends after the ended state. Nothing is sent, and nothing is
read, while nothing changes. A controller that stops serving (shutdown, no longer the leader) ends its
streams with ``UNAVAILABLE``; the client watches the same id again, wherever the leader now is.

Non-goals: history (``GetRolloutHistory``), and watching many things in one stream.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc.aio

from topo_tune.benchmark.probe_record import ProbeRound
from topo_tune.controller import names
from topo_tune.controller.api.messages import (
    to_proto_benchmark_job,
    to_proto_drift_check,
    to_proto_probe_round,
    to_proto_rollout,
    to_proto_study,
)
from topo_tune.controller.api.status_codes import abort
from topo_tune.controller.benchmarks.service import BenchmarkJobs, JobProgress
from topo_tune.controller.probes import Probes
from topo_tune.controller.rollout.engine import RolloutEngine
from topo_tune.controller.rollout.state import Snapshot, WavePhase
from topo_tune.controller.study_records import Study
from topo_tune.errors import ConflictError
from topo_tune.v1 import admin_pb2

if TYPE_CHECKING:
    from topo_tune.controller.drift import DriftChecker
    from topo_tune.controller.drift.store import DriftCheck
    from topo_tune.controller.studies import Studies

Ctx = grpc.aio.ServicerContext[Any, Any]
S = TypeVar("S")
Req = TypeVar("Req")
Resp = TypeVar("Resp")


def maps_stream_errors(
    method: Callable[[S, Req, Ctx], AsyncIterator[Resp]],
) -> Callable[[S, Req, Ctx], AsyncIterator[Resp]]:
    """Decorate a server-streaming servicer method so domain errors become their status codes."""

    @functools.wraps(method)
    async def wrapper(self: S, request: Req, context: Ctx) -> AsyncIterator[Resp]:
        try:
            async for item in method(self, request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as error:
            await abort(context, error)

    return wrapper


# -- the wire form of each update (kept here, in one place) ----------------------------------------------------


def job_update(found: JobProgress) -> admin_pb2.BenchmarkJobUpdate:
    progress = admin_pb2.Progress(done=found.nodes_done, total=found.nodes_total)
    return admin_pb2.BenchmarkJobUpdate(job=to_proto_benchmark_job(found.job), progress=progress)


def round_update(found: ProbeRound) -> admin_pb2.ProbeRoundUpdate:
    progress = admin_pb2.Progress(done=len(found.measurements), total=found.pairs_total)
    return admin_pb2.ProbeRoundUpdate(round=to_proto_probe_round(found), progress=progress)


def check_update(found: tuple[DriftCheck, int]) -> admin_pb2.DriftCheckUpdate:
    check, ended = found
    progress = admin_pb2.Progress(done=ended, total=len(check.job_ids))
    return admin_pb2.DriftCheckUpdate(check=to_proto_drift_check(check), progress=progress)


def rollout_update(rollout: admin_pb2.RolloutInfo, snapshot: Snapshot) -> admin_pb2.RolloutUpdate:
    done = sum(1 for wave in snapshot.waves if wave.phase is WavePhase.COMPLETED)
    return admin_pb2.RolloutUpdate(rollout=rollout, progress=admin_pb2.Progress(done=done, total=len(snapshot.waves)))


def study_update(found: Study) -> admin_pb2.StudyUpdate:
    progress = admin_pb2.Progress(done=found.done, total=found.total)
    return admin_pb2.StudyUpdate(study=to_proto_study(found), progress=progress)


# -- the servicer methods --------------------------------------------------------------------------------------


class WatchServicerMixin:
    """Implements the ``Watch*`` RPCs of ``AdminService``; the servicer sets the services it reads."""

    _jobs: BenchmarkJobs
    _probes: Probes
    _rollouts: RolloutEngine
    _drift: DriftChecker | None
    _studies: Studies | None

    @maps_stream_errors
    async def WatchBenchmark(
        self, request: admin_pb2.WatchRequest, context: Ctx
    ) -> AsyncIterator[admin_pb2.BenchmarkJobUpdate]:
        names.command_id(request.id, "id")
        async for found in self._jobs.watch(request.id):
            yield job_update(found)

    @maps_stream_errors
    async def WatchProbeRound(
        self, request: admin_pb2.WatchRequest, context: Ctx
    ) -> AsyncIterator[admin_pb2.ProbeRoundUpdate]:
        names.command_id(request.id, "id")
        async for found in self._probes.watch(request.id):
            yield round_update(found)

    @maps_stream_errors
    async def WatchDriftCheck(
        self, request: admin_pb2.WatchRequest, context: Ctx
    ) -> AsyncIterator[admin_pb2.DriftCheckUpdate]:
        names.command_id(request.id, "id")
        if self._drift is None:  # pragma: no cover - the server always wires it
            raise ConflictError("this controller runs no drift checks")
        async for found in self._drift.watch(request.id):
            yield check_update(found)

    @maps_stream_errors
    async def WatchRollout(
        self, request: admin_pb2.WatchRequest, context: Ctx
    ) -> AsyncIterator[admin_pb2.RolloutUpdate]:
        names.command_id(request.id, "id")
        store = self._rollouts.store

        async def read() -> tuple[admin_pb2.RolloutInfo, Snapshot]:
            snapshot = await store.load(request.id)
            return to_proto_rollout(snapshot, await store.gates(request.id)), snapshot

        async for rollout, snapshot in self._rollouts.changes.follow(
            request.id, read, lambda found: found[1].rollout.phase.final
        ):
            yield rollout_update(rollout, snapshot)

    @maps_stream_errors
    async def WatchStudy(self, request: admin_pb2.WatchRequest, context: Ctx) -> AsyncIterator[admin_pb2.StudyUpdate]:
        names.study_id(request.id, "id")
        if self._studies is None:  # pragma: no cover - the server always wires it
            raise ConflictError("this controller runs no studies")
        async for found in self._studies.watch(request.id):
            yield study_update(found)
