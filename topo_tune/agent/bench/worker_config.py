"""What the launcher tells one worker process, as a JSON file next to its other files.

A worker reads the paths of these files, one job each, from its stdin (see ``kept_workers``); its
environment carries only the variables of its first job (see ``launcher``), the file those a kept worker
sets anew for each job (``job_env``). The file also names where the worker writes its progress
(JSON lines, appended and flushed, so the launcher can say where a killed rank was), its output (the
job's ``stderr.log``) and its result (written atomically at the end).

``WorkerFault`` is a test-only fault hook. It exists only in this file, which the agent writes
itself; no wire message can set it, so a controller cannot trigger it.

Non-goals: torch (the launcher imports this module, workers import it before torch).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topo_tune.benchmark.job_spec import BenchmarkSpec
from topo_tune.nccl.backends import Backend
from topo_tune.plugin.job_env import TABLE_ENV

__all__ = ["PER_COMMUNICATOR_ENV", "WorkerConfig", "WorkerFault", "per_job"]

PER_COMMUNICATOR_ENV = frozenset({TABLE_ENV})
"""Variables read anew for every communicator (the tuner plugin's table path, read at each ``init``), so a kept
worker can take them from each job; every other variable is read by NCCL once per process."""


def per_job(key: str, backend: Backend) -> bool:
    """Whether a kept worker takes ``key`` from each job rather than from its start.

    ``PER_COMMUNICATOR_ENV`` on every backend; on gloo also every ``NCCL_*`` variable, which no part of a gloo
    job reads (a search on gloo varies them per trial, and each would otherwise need fresh workers).
    """
    return key in PER_COMMUNICATOR_ENV or (backend is Backend.GLOO and key.startswith("NCCL_"))


@dataclass(frozen=True, slots=True)
class WorkerFault:
    """Faults a test may inject into one rank of a job (never set from the wire)."""

    hang_before_join_rank: int | None = None
    """This rank blocks forever before it contacts the rendezvous."""
    corrupt_rank: int | None = None
    """This rank alters one element of its output before the data check."""


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    spec: BenchmarkSpec
    rank: int
    device: int
    """The GPU this rank runs on (-1 on CPU backends); several ranks share one in ``--ranks-per-gpu`` mode."""
    backend: Backend
    """One of ``LAUNCHED_BACKENDS`` (``nccl`` or ``gloo``)."""
    bind_address: str
    """Address gloo binds its sockets to (this node's address)."""
    rendezvous_timeout_s: float
    progress_path: Path
    result_path: Path
    stderr_path: Path
    """Where the worker's stdout and stderr go while it runs this job."""
    sys_path: tuple[str, ...]
    """The agent's ``sys.path``, so the worker imports the same packages as the agent."""
    cpus: tuple[int, ...] = ()
    """CPUs the worker pins itself to (those near its GPU); empty: inherit the agent's."""
    fault: WorkerFault = WorkerFault()
    job_env: dict[str, str] = field(default_factory=dict)
    """This job's values of the variables :func:`per_job` names (a key absent here is unset for the job)."""
    communicator_dir: Path | None = None
    """Where a communicator kept for later jobs keeps its files (the kept set's directory); None: the communicator
    does not outlive the job (see ``kept_communicator``)."""
    last_job: bool = False
    """The worker's process ends after this job (it will not be kept): its communicator is left to that end."""

    def dump(self, path: Path) -> None:
        data: dict[str, Any] = {
            "spec": self.spec.to_json(),
            "rank": self.rank,
            "device": self.device,
            "backend": self.backend.value,
            "bind_address": self.bind_address,
            "rendezvous_timeout_s": self.rendezvous_timeout_s,
            "progress_path": str(self.progress_path),
            "result_path": str(self.result_path),
            "stderr_path": str(self.stderr_path),
            "sys_path": list(self.sys_path),
            "cpus": list(self.cpus),
            "fault": {
                "hang_before_join_rank": self.fault.hang_before_join_rank,
                "corrupt_rank": self.fault.corrupt_rank,
            },
            "job_env": self.job_env,
            "communicator_dir": None if self.communicator_dir is None else str(self.communicator_dir),
            "last_job": self.last_job,
        }
        path.write_text(json.dumps(data))

    @classmethod
    def load(cls, path: Path) -> WorkerConfig:
        data = json.loads(path.read_text())
        return cls(
            spec=BenchmarkSpec.from_json(data["spec"]),
            rank=data["rank"],
            device=data["device"],
            backend=Backend(data["backend"]),
            bind_address=data["bind_address"],
            rendezvous_timeout_s=data["rendezvous_timeout_s"],
            progress_path=Path(data["progress_path"]),
            result_path=Path(data["result_path"]),
            stderr_path=Path(data["stderr_path"]),
            sys_path=tuple(data["sys_path"]),
            cpus=tuple(data["cpus"]),
            fault=WorkerFault(**data["fault"]),
            job_env={str(k): str(v) for k, v in data["job_env"].items()},
            communicator_dir=None if data["communicator_dir"] is None else Path(data["communicator_dir"]),
            last_job=bool(data["last_job"]),
        )
