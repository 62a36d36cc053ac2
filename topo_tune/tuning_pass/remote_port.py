"""The tuning pass's ``controller_port.AdminPort`` over the admin client: what ``topo-tune init`` runs its pass through.

The client hands nodes, benchmark jobs and probe rounds over as domain objects. A controller that restarts under
the pass (a crash, a redeploy, its database away) is waited for, up to ``restart_wait_s`` (2 minutes by default),
saying so once per outage, instead of ending the pass: every call is retried until the controller answers. That
is safe because each call is a read or an idempotent write (a benchmark job goes out under an id chosen here, so a
job the controller stored before it died is found again, not started twice). Non-goals: the CLI's own calls, transport.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from topo_tune.benchmark.job_record import BenchmarkJob, BenchmarkRequest
from topo_tune.benchmark.probe_record import PairMeasurement, ProbeRequest, ProbeRound
from topo_tune.client.admin import AdminClient
from topo_tune.errors import ControllerUnavailable
from topo_tune.ids import JobId
from topo_tune.node_record import NodeInfo, NodeInventory
from topo_tune.v1 import admin_pb2

T = TypeVar("T")
RESTART_WAIT_S = 120.0
"""How long the pass waits for a controller that stopped answering before it gives up."""


class RemotePort:
    """``admin_port.AdminPort`` over the admin API: what ``topo-tune init`` runs its pass through.

    Converts between the pass's domain objects and the wire here, at the client's edge; rides out a controller
    restart of up to ``restart_wait_s``, calling ``on_wait`` with one line when it starts waiting."""

    def __init__(
        self,
        client: AdminClient,
        *,
        restart_wait_s: float = RESTART_WAIT_S,
        on_wait: Callable[[str], None] = lambda _line: None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.restart_wait_s = restart_wait_s
        self._on_wait = on_wait
        self._sleep = sleep

    def _riding_out(self, call: Callable[[], T]) -> T:
        """``call``, again and again while the controller cannot be reached, for up to ``restart_wait_s``."""
        since: float | None = None
        pause = 0.2
        while True:
            try:
                return call()
            except ControllerUnavailable as error:
                now = time.monotonic()
                if since is None:
                    since = now
                    self._on_wait(f"{error}; waiting up to {self.restart_wait_s:g} s for the controller to answer")
                elif now - since > self.restart_wait_s:
                    raise ControllerUnavailable(
                        f"{error} (waited {self.restart_wait_s:g} s for the controller to come back)"
                    ) from None
            self._sleep(pause)
            pause = min(pause * 2, 2.0)

    def list_nodes(self, *, rack: str = "") -> list[NodeInfo]:
        return self._riding_out(lambda: self.client.list_nodes(rack=rack))

    def cluster_topology(self) -> NodeInventory:
        return self._riding_out(self.client.cluster_topology)

    def start_probe_round(self, request: ProbeRequest) -> ProbeRound:
        # No id of our own to make a repeat idempotent: a round the controller stored but never answered for
        # runs again (a measurement repeated; nothing is counted twice).
        return self._riding_out(lambda: self.client.start_probe_round(request))

    def get_probe_round(self, round_id: str) -> ProbeRound:
        return self._riding_out(lambda: self.client.get_probe_round(round_id))

    def wait_probe_round(self, round_id: str) -> ProbeRound:
        return self._riding_out(lambda: self.client.wait_probe_round(round_id))

    def measured_pairs(self) -> list[PairMeasurement]:
        return self._riding_out(self.client.measured_pairs)

    def start_benchmark(self, request: BenchmarkRequest) -> BenchmarkJob:
        if not request.job_id:  # our own id: a repeat after a restart finds the job the controller stored
            request = dataclasses.replace(request, job_id=f"bj-{uuid.uuid4().hex[:12]}")
        return self._riding_out(lambda: self.client.start_benchmark(request))

    def get_benchmark(self, job_id: JobId) -> BenchmarkJob:
        return self._riding_out(lambda: self.client.get_benchmark(job_id))

    def wait_benchmark(self, job_id: JobId) -> BenchmarkJob:
        return self._riding_out(lambda: self.client.wait_benchmark(job_id))

    def put_config_version(
        self, files: dict[str, str], provenance: dict[str, str], *, version_id: str = ""
    ) -> admin_pb2.ConfigVersionInfo:
        return self._riding_out(lambda: self.client.put_config_version(files, provenance, version_id=version_id))
