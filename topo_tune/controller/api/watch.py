"""The admin API's watch streams: one job, probe round, drift check, rollout or study, from now until it ends.

Each stream sends the state now, then again each time the controller commits a change to it (the services
wake it: `topo_tune.controller.changes`), and ends after the ended state. Nothing is sent, and nothing is
read, while nothing changes. A controller that stops serving (shutdown, no longer the leader) ends its
streams with ``UNAVAILABLE``; the client watches the same id again, wherever the leader now is.

Non-goals: history (``GetRolloutHistory``), and watching many things in one stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc.aio

from topo_tune.controller import names
from topo_tune.controller.api.messages import (
    to_proto_check_update,
    to_proto_job_update,
    to_proto_rollout_update,
    to_proto_round_update,
    to_proto_study_update,
)
from topo_tune.controller.api.rollout_messages import to_proto_rollout
from topo_tune.controller.api.status_codes import maps_stream_errors
from topo_tune.controller.benchmarks.service import BenchmarkJobs
from topo_tune.controller.probes import Probes
from topo_tune.controller.rollout.engine import RolloutEngine
from topo_tune.controller.rollout.state import Snapshot
from topo_tune.errors import ConflictError
from topo_tune.v1 import admin_pb2

if TYPE_CHECKING:
    from topo_tune.controller.api.in_process import InProcessPort
    from topo_tune.controller.drift import DriftChecker
    from topo_tune.controller.studies import Studies

Ctx = grpc.aio.ServicerContext[Any, Any]


class WatchServicerMixin:
    """Implements the ``Watch*`` RPCs of ``AdminService``; the servicer sets the services it reads."""

    _jobs: BenchmarkJobs
    _probes: Probes
    _rollouts: RolloutEngine
    _drift: DriftChecker | None
    _studies: Studies[InProcessPort] | None

    @maps_stream_errors
    async def WatchBenchmark(
        self, request: admin_pb2.WatchRequest, context: Ctx
    ) -> AsyncIterator[admin_pb2.BenchmarkJobUpdate]:
        names.command_id(request.id, "id")
        async for found in self._jobs.watch(request.id):
            yield to_proto_job_update(found)

    @maps_stream_errors
    async def WatchProbeRound(
        self, request: admin_pb2.WatchRequest, context: Ctx
    ) -> AsyncIterator[admin_pb2.ProbeRoundUpdate]:
        names.command_id(request.id, "id")
        async for found in self._probes.watch(request.id):
            yield to_proto_round_update(found)

    @maps_stream_errors
    async def WatchDriftCheck(
        self, request: admin_pb2.WatchRequest, context: Ctx
    ) -> AsyncIterator[admin_pb2.DriftCheckUpdate]:
        names.command_id(request.id, "id")
        if self._drift is None:  # pragma: no cover - the server always wires it
            raise ConflictError("this controller runs no drift checks")
        async for found in self._drift.watch(request.id):
            yield to_proto_check_update(found)

    @maps_stream_errors
    async def WatchRollout(
        self, request: admin_pb2.WatchRequest, context: Ctx
    ) -> AsyncIterator[admin_pb2.RolloutUpdate]:
        rollout_id = names.rollout_id(request.id, "id")
        store = self._rollouts.store

        async def read() -> tuple[admin_pb2.RolloutInfo, Snapshot]:
            snapshot = await store.load(rollout_id)
            return to_proto_rollout(snapshot, await store.gates(rollout_id)), snapshot

        async for rollout, snapshot in self._rollouts.changes.follow(
            request.id, read, lambda found: found[1].rollout.phase.final
        ):
            yield to_proto_rollout_update(rollout, snapshot)

    @maps_stream_errors
    async def WatchStudy(self, request: admin_pb2.WatchRequest, context: Ctx) -> AsyncIterator[admin_pb2.StudyUpdate]:
        names.study_id(request.id, "id")
        if self._studies is None:  # pragma: no cover - the server always wires it
            raise ConflictError("this controller runs no studies")
        async for found in self._studies.watch(request.id):
            yield to_proto_study_update(found)
