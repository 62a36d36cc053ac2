"""The admin calls a study's pass makes (``admin_port.AdminPort``), answered by this controller's services.

A study runs ``run_pass`` in a worker thread; this port hands each call to the services on the controller's
event loop and waits for the answer, so a study goes through exactly the code the admin API uses. Benchmark
jobs, probe rounds and config versions pass through as domain objects; the registry's nodes are converted here
to what the pass reads. Non-goals: the study's life cycle (``studies.py``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from topo_tune.benchmark.job_record import BenchmarkJob, BenchmarkRequest
from topo_tune.benchmark.probe_record import PairMeasurement, ProbeRequest, ProbeRound
from topo_tune.controller.benchmarks.service import BenchmarkJobs
from topo_tune.controller.config_versions import ConfigVersions, StoredVersion
from topo_tune.controller.nodes import NodeRegistry
from topo_tune.controller.probes import Probes
from topo_tune.errors import StudyCancelled
from topo_tune.ids import JobId
from topo_tune.node_record import NodeInfo, NodeInventory

T = TypeVar("T")


@dataclass
class InProcessPort:
    """``AdminPort`` for a study's worker thread: each call runs on ``loop`` and is waited for."""

    loop: asyncio.AbstractEventLoop
    cancelled: threading.Event
    """Set by ``admin study cancel``: the next benchmark the pass asks for raises ``StudyCancelled``."""
    registry: NodeRegistry
    jobs: BenchmarkJobs
    probes: Probes
    config_versions: ConfigVersions
    spine: tuple[float | None, float | None]

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def list_nodes(self, *, rack: str = "") -> list[NodeInfo]:
        return [v.info(with_topology=False) for v in self._run(self.registry.list(rack=rack))]

    def cluster_topology(self) -> NodeInventory:
        oversubscription, bandwidth = self.spine
        nodes = tuple(v.info(with_topology=True) for v in self._run(self.registry.list()))
        return NodeInventory(nodes, spine_oversubscription=oversubscription, spine_bandwidth_gbps=bandwidth)

    def start_probe_round(self, request: ProbeRequest) -> ProbeRound:
        return self._run(self.probes.start(request))

    def get_probe_round(self, round_id: str) -> ProbeRound:
        return self._run(self.probes.get(round_id))

    def wait_probe_round(self, round_id: str) -> ProbeRound:
        return self._run(self.probes.wait(round_id))

    def measured_pairs(self) -> list[PairMeasurement]:
        return self._run(self.probes.measured_pairs())

    def start_benchmark(self, request: BenchmarkRequest) -> BenchmarkJob:
        if self.cancelled.is_set():
            raise StudyCancelled("cancelled by an admin")
        return self._run(self.jobs.start(request))

    def get_benchmark(self, job_id: JobId) -> BenchmarkJob:
        return self._run(self.jobs.get(job_id))

    def wait_benchmark(self, job_id: JobId) -> BenchmarkJob:
        return self._run(self.jobs.wait(job_id))

    def put_config_version(
        self, files: dict[str, str], provenance: dict[str, str], *, version_id: str = ""
    ) -> StoredVersion:
        return self._run(self.config_versions.put(files, provenance, claimed_id=version_id))
