"""A benchmark worker's process group (communicator) kept for the next job of the same membership.

A kept worker (``kept_workers``) skips the process start, but a job in it still paid for a new communicator: its
creation and, at the job's end, its destruction (NCCL's destroy alone was 0.5-0.7 s on an H200, most of a kept
job's 0.53 s; ``benchmarks/results/worker-reuse.md``). So a worker may keep its communicator for its next job when
that job has the same :func:`communicator_key`: the same ranks on the same nodes and devices, rendezvous host,
backend and job environment, and the same content of every per-communicator input (``PER_COMMUNICATOR_ENV``:
NCCL's tuner plugin reads its table when a communicator is made, so a job with another table needs a new one).

Every rank must decide alike, or one waits in a rendezvous its peers never join; so the decision comes from the
job's own rendezvous store, never from local state alone (:meth:`KeptCommunicator.join`). Before it marks
itself arrived, each rank holding a communicator fit for the job counts itself under that communicator's
creation id (drawn by rank 0 when it was made, the same on every member); once every rank has arrived, each
reads the count, and the communicator is reused only when all ``world_size`` ranks counted under the one id. In
any other case (a restarted agent's fresh workers, an evicted set, another table or rank map) every rank
destroys what it holds and all make a new one together, on a store of its own that rank 0 hosts on a port the
system picks (the job's rendezvous port is then free again at the job's end; the kept one holds its own).
A node's members of one communicator are the processes of one kept set, taken and decided together, so they
destroy it together too: NCCL's destroy waits for the communicator's other ranks on the same node.

Not kept: a communicator whose process is kept without it (``communicator_dir`` unset) is destroyed at the job's
end, and so is one of a process counting calls into a workload directory (``WORKLOAD_ENV``: the plugin writes a
communicator's counts when it is destroyed, so they would sum several jobs). A process that ends after its job
(``last_job``: the launcher will not keep it) leaves its communicator to its end instead, once every rank of the
job is done with it (``_done_together``), and ends without Python's finalisers: destroying it took about 0.5 s.
The plugin's record of NCCL's choices (``RECORD_ENV``) is opened when a communicator is made and
holds each distinct call once: a kept communicator's record lives in the kept set's directory, and each job
reads its own calls' choices from it (the same communicator and table decide a call alike in every job).

Non-goals: which processes are kept (``kept_workers``), the job's rendezvous and measuring (``worker``).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NewType

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, ProcessGroupGloo, Store, TCPStore  # type: ignore[attr-defined]

from topo_tune.agent.bench.worker_config import PER_COMMUNICATOR_ENV, WorkerConfig
from topo_tune.plugin.job_env import PLUGIN_ENV, WORKLOAD_ENV
from topo_tune.plugin.record import RECORD_ENV

__all__ = ["GLOO_BACKEND_NAME", "CommunicatorKey", "KeptCommunicator", "communicator_key"]

logger = logging.getLogger(__name__)

CommunicatorKey = NewType("CommunicatorKey", str)
"""The content hash of everything a communicator must share with a job that is to run on it."""

GLOO_BACKEND_NAME = "topo_tune_gloo"
_HOLDERS_PREFIX = "topo_tune/holding/"
"""Counted in the job's store, per creation id: how many of the job's ranks hold that communicator."""
_OWN_STORE = "topo_tune/communicator"
"""Rank 0's answer in the job's store when a new communicator is made: its own store's port and creation id."""
_DONE = "topo_tune/done"
"""Counted in the job's store by each rank of a last job once its device work finished (``_done_together``)."""
_SEEN = "topo_tune/seen-done"
"""Counted by each rank but 0 once it saw every rank done: rank 0 serves the store until then."""


def communicator_key(config: WorkerConfig, env: Mapping[str, str]) -> CommunicatorKey:
    """The key of the communicator ``config``'s job needs, from its spec and ``env`` (this process's environment).

    Per-communicator variables count by the content of the file they name (the staged table's path changes
    with every job, its content need not). Values read only here (a table file) cannot make ranks disagree:
    a rank whose key differs counts under no id, and then every rank makes a new communicator.
    """
    spec = config.spec
    per_communicator = {key: _content_digest(env[key]) for key in sorted(PER_COMMUNICATOR_ENV) if key in env}
    text = json.dumps(
        {
            "backend": config.backend.value,
            "world_size": spec.world_size,
            "ranks": sorted((s.rank, s.node_name, s.local_rank, s.device) for s in spec.ranks),
            "rendezvous_host": spec.rendezvous_host,
            "env": {k: v for k, v in spec.env.items() if k not in PER_COMMUNICATOR_ENV},
            "per_communicator": per_communicator,
        },
        sort_keys=True,
    )
    return CommunicatorKey(hashlib.sha256(text.encode()).hexdigest()[:24])


def _content_digest(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        return f"{path}: {exc.strerror}"


@dataclass(frozen=True, slots=True)
class _Held:
    key: CommunicatorKey
    creation: str
    rank: int
    store: Store
    """The communicator's own store; rank 0 serves it for as long as the communicator lives."""
    record: Path | None
    """The tuner plugin's record of this communicator's calls (None: the plugin is not recording)."""


class KeptCommunicator:
    """This worker process's communicator (torch's default process group) and whether it outlives a job."""

    def __init__(self) -> None:
        self._held: _Held | None = None
        self.made = 0
        """Communicators this process has made."""
        self.left = False
        """The communicator held is left to the process's end: the process must end without destroying it."""

    def ticket(self, key: CommunicatorKey, rank: int) -> str:
        """The store key this rank counts itself under before it arrives ("" when it holds nothing fit for it)."""
        held = self._held
        if held is None or held.key != key or held.rank != rank:
            return ""
        return f"{_HOLDERS_PREFIX}{held.creation}"

    @property
    def record(self) -> Path | None:
        """Where the plugin records the calls of the communicator held now."""
        return None if self._held is None else self._held.record

    def join(self, config: WorkerConfig, *, store: Store, ticket: str, key: CommunicatorKey) -> bool:
        """Make the job's communicator or reuse the one held; True when reused.

        Call once every rank has arrived in ``store`` (each after counting itself under its ``ticket``).
        """
        world = config.spec.world_size
        if ticket and int(store.add(ticket, 0)) == world:
            return True
        self.release()
        self._make(config, store=store, key=key)
        return False

    def end_of_job(self, config: WorkerConfig, *, store: Store) -> None:
        """Keep the communicator for a later job where it may be kept; in a process that ends after this job, leave
        it to that end once every rank is done with it (``store``: the job's); else destroy it."""
        if WORKLOAD_ENV in os.environ:
            self.release()  # the plugin writes a communicator's counts when it is destroyed
        elif config.last_job:
            _done_together(config, store=store)
            self.left = self._held is not None
        elif config.communicator_dir is None:
            self.release()

    def release(self) -> None:
        """Destroy the communicator held (if any) and close its store."""
        if self._held is None:
            return
        self._held = None  # the last reference to its store goes with the group: rank 0 stops serving it
        dist.destroy_process_group()

    def _make(self, config: WorkerConfig, *, store: Store, key: CommunicatorKey) -> None:
        spec = config.spec
        timeout = datetime.timedelta(seconds=config.rendezvous_timeout_s)
        if config.rank == 0:
            own = TCPStore(
                spec.rendezvous_host, 0, spec.world_size, is_master=True, timeout=timeout, wait_for_workers=False
            )
            creation = uuid.uuid4().hex
            store.set(_OWN_STORE, f"{own.port} {creation}")
        else:
            port, creation = store.get(_OWN_STORE).decode().split()
            own = TCPStore(spec.rendezvous_host, int(port), spec.world_size, is_master=False, timeout=timeout)
        record = self._record_path(config)
        os.environ.pop(RECORD_ENV, None)  # never the previous communicator's file
        if record is not None:
            record.unlink(missing_ok=True)
            # Read by the plugin when NCCL creates the communicator (putenv: NCCL's getenv sees it).
            os.environ[RECORD_ENV] = str(record)
        pg_store = PrefixStore("pg", own)
        if config.backend.runs_nccl:
            device = torch.device("cuda", config.device)
            dist.init_process_group(
                "nccl", store=pg_store, rank=config.rank, world_size=spec.world_size, timeout=timeout, device_id=device
            )
        else:
            _register_gloo(config.bind_address)
            dist.init_process_group(
                GLOO_BACKEND_NAME, store=pg_store, rank=config.rank, world_size=spec.world_size, timeout=timeout
            )
        self._held = _Held(key=key, creation=creation, rank=config.rank, store=own, record=record)
        self.made += 1

    @staticmethod
    def _record_path(config: WorkerConfig) -> Path | None:
        if not (config.backend.runs_nccl and os.environ.get(PLUGIN_ENV)):
            return None
        if config.communicator_dir is None:
            return config.result_path.with_name("tuner_record.csv")
        return config.communicator_dir / f"tuner_record.rank{config.rank}.csv"


def _done_together(config: WorkerConfig, *, store: Store) -> None:
    """Return once every rank of the job is done with its communicator (its device work finished), and on rank 0,
    which serves ``store``, once every other rank has seen that.

    A rank may then end without destroying the communicator: no peer still reads its memory (NCCL's transports
    within a node map each other's buffers) or asks its store anything. Destroying it instead cost about 0.5 s
    on an H200: NCCL joins its proxy threads, one of which looks for the stop only between polls of 500 ms
    (``ncclProxyServiceUDS`` in NCCL's ``src/proxy.cc``, 2.28 and 2.30).
    """
    world = config.spec.world_size
    if world == 1:
        return
    if config.backend.runs_nccl:
        torch.cuda.synchronize()
    if store.add(_DONE, 1) == world:
        store.set(f"{_DONE}/all", "1")
    store.wait([f"{_DONE}/all"])
    if config.rank == 0:
        store.wait([f"{_SEEN}/all"])
    elif store.add(_SEEN, 1) == world - 1:
        store.set(f"{_SEEN}/all", "1")


def _register_gloo(bind_address: str) -> None:
    """Register a gloo backend whose sockets bind to ``bind_address`` (this node's address), once per process.

    A kept worker's jobs share its bind address (it is part of the set's key), so the first registration stands.
    """
    if GLOO_BACKEND_NAME in dist.Backend.backend_list:
        return

    def create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Any:
        # The private options type is the only way to hand gloo a device bound to one address.
        options = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        options._timeout = timeout
        options._devices = [ProcessGroupGloo.create_device(hostname=bind_address)]
        return ProcessGroupGloo(store, rank, size, options)

    dist.Backend.register_backend(GLOO_BACKEND_NAME, create, devices=["cpu"])
