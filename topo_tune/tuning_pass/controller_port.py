"""What a tuning pass needs of a controller, in domain terms: the admin client or the controller's services.

The admin client's port (``remote_port.RemotePort``) converts at its own edge; a controller-run study answers
in-process (``controller/api/in_process.py``). Non-goal: anything an operator does (nodes' commands, rollouts).
"""

from __future__ import annotations

from typing import Protocol

from topo_tune.benchmark.job_record import BenchmarkJob, BenchmarkRequest
from topo_tune.benchmark.probe_record import PairMeasurement, ProbeRequest, ProbeRound
from topo_tune.ids import JobId
from topo_tune.node_record import NodeInfo, NodeInventory


class AdminPort(Protocol):
    """What the pass needs of a controller: the admin client, or the controller's own services in-process."""

    def list_nodes(self, *, rack: str = "") -> list[NodeInfo]:
        """The registered nodes, without their topologies."""

    def cluster_topology(self) -> NodeInventory: ...
    def start_probe_round(self, request: ProbeRequest) -> ProbeRound: ...
    def get_probe_round(self, round_id: str) -> ProbeRound: ...
    def wait_probe_round(self, round_id: str) -> ProbeRound:
        """The round once it has ended (woken by the controller, not polled)."""

    def measured_pairs(self) -> list[PairMeasurement]: ...
    def start_benchmark(self, request: BenchmarkRequest) -> BenchmarkJob: ...
    def get_benchmark(self, job_id: JobId) -> BenchmarkJob: ...
    def wait_benchmark(self, job_id: JobId) -> BenchmarkJob:
        """The job once it has ended (woken by the controller, not polled)."""

    def put_config_version(
        self, files: dict[str, str], provenance: dict[str, str], *, version_id: str = ""
    ) -> object: ...
