"""Runs one command on this node and turns the outcome into a ``CommandResult``.

Each command kind has one handler. Handlers run in a worker thread where they block (discovery,
benchmarks), never raise (a failure becomes a ``failed`` result carrying the reason), and a drained node
rejects benchmark work. Kinds this agent cannot carry out are ``rejected`` with the reason, never silently
dropped. Benchmarks run on the agent's backend: real workers for ``nccl``/``gloo``
(``topo_tune.agent.bench``), the analytic model for ``sim`` (``sim_backend``).

``apply_config`` stages and activates a config version in the node's config store: a version that breaks
the contract (a path outside the directory, a variable the env policy refuses, an id that is not the files'
hash) is ``rejected`` before anything is written; a node busy with a benchmark or a job ``fails`` it with
the reason, and the controller tries again later. Applies run one at a time, in the order they arrived.

Deadlines: a command's ``deadline_at`` is absolute (the controller's clock; nodes keep time with NTP), so a
benchmark or probe re-sent after it is ``timed_out`` without starting a worker, and one re-sent late runs only
for the time left; ``deadline_s`` still bounds it, and alone (an older controller) counts from the start here.
``cancel_job`` ends a benchmark job or probe on this node (its workers killed, its later command refused).

A result's message is cut to ``MAX_RESULT_MESSAGE`` characters (a refusal that names thousands of variables,
a worker's huge error), so that the controller never refuses the result itself.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from topo_tune.agent import discovery
from topo_tune.agent.bench.benchmark_executor import BenchmarkExecutor
from topo_tune.agent.bench.tuner_plugin import TunerPluginStage
from topo_tune.agent.config_store import ConfigStore
from topo_tune.agent.journal import Journal
from topo_tune.agent.sim_backend import run_simulated
from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.errors import ConfigWriteError, ConflictError, StoreBusy, ValidationError
from topo_tune.ids import ConfigVersionId
from topo_tune.nccl.backends import Backend
from topo_tune.v1 import agent_pb2, topology_pb2

logger = logging.getLogger(__name__)

DRAINED_KEY = "drained"
MAX_RESULT_MESSAGE = 16 * 1024
"""Characters of a result's message sent to the controller. Well under what the controller accepts: a result
it refuses closes the session, and the journal would re-send that result on every reconnect."""


@dataclass
class CommandExecutor:
    journal: Journal
    node_name: str = "localhost"
    backend: Backend = Backend.GLOO
    work_dir: Path = Path("/var/lib/topo-tune/bench")
    policy: EnvPolicy = field(default_factory=EnvPolicy)
    bind_address: str = "127.0.0.1"
    default_deadline_s: float = 600.0
    discover: Callable[[], topology_pb2.NodeTopology] = discovery.discover
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    config_store: ConfigStore | None = None
    tuner_plugin: TunerPluginStage | None = None
    """Stages benchmark jobs' candidate tuner tables; ``None``: such jobs are rejected."""
    worker_env: Mapping[str, str] = field(default_factory=dict)
    """The node's own variables for every benchmark worker; they win over a job's (see the launcher)."""
    ranks_per_gpu: int = 1
    """Benchmark ranks on each GPU (more than 1: the ``--ranks-per-gpu`` test and development mode)."""
    kept_worker_sets: int = 0
    """Idle benchmark worker sets kept for later jobs of the same environment (see ``kept_workers``)."""
    _bench: BenchmarkExecutor | None = field(default=None, init=False)
    _bench_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _benchmarks_running: int = field(default=0, init=False)
    _config_lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    _reported_damage: str = field(default="", init=False)

    @property
    def drained(self) -> bool:
        return self.journal.get_state(DRAINED_KEY) == "1"

    def _benchmarks(self) -> BenchmarkExecutor:
        # One, whichever thread asks first: a cancel must reach the launchers its job runs on.
        with self._bench_lock:
            if self._bench is None:
                self._bench = BenchmarkExecutor(
                    policy=self.policy,
                    bind_address=self.bind_address,
                    node_env=self.worker_env,
                    tuner_plugin=self.tuner_plugin,
                    ranks_per_gpu=self.ranks_per_gpu,
                    kept_worker_sets=self.kept_worker_sets,
                )
            return self._bench

    def stop_benchmarks(self) -> None:
        """The agent is stopping: kill the running benchmark's workers (see ``Launcher.stop``)."""
        if self._bench is not None:
            self._bench.stop()

    def rebind(self, address: str) -> None:
        """Use ``address`` for the next benchmark job (the current one, if any, keeps its sockets)."""
        if address:
            self.bind_address = address
            if self._bench is not None:
                # The same executor, so its launchers' one-job-at-a-time locks hold across the change.
                self._bench.rebind(address)

    def _deadline(self, command: agent_pb2.Command) -> float:
        """Seconds the command may still run: what is left of ``deadline_at``, at most ``deadline_s``."""
        relative = float(command.deadline_s) if command.deadline_s else self.default_deadline_s
        if not command.HasField("deadline_at"):
            return relative
        left = (command.deadline_at.ToDatetime(UTC) - self.clock()).total_seconds()
        return min(relative, left)

    def _cancel(self, request: agent_pb2.CancelJob, result: agent_pb2.CommandResult) -> None:
        result.status = agent_pb2.COMMAND_STATUS_SUCCEEDED
        if self.backend.launches_workers and self._benchmarks().cancel(request.job_id, request.reason):
            result.message = f"job {request.job_id} cancelled: its workers were killed"
        else:  # sim jobs finish as they start; a real one that arrives later is refused
            result.message = f"job {request.job_id} was not running here; it will not start"
        logger.info("%s (%s)", result.message, request.reason, extra={"job": request.job_id})

    def _benchmark(self, command: agent_pb2.Command) -> agent_pb2.CommandResult:
        run = command.run_benchmark
        confs = {env.get("NCCL_CONF_FILE", "") for env in (run.env, *(more.env for more in run.next_specs))} - {""}
        damages = (
            [self.config_store.damage_of_file(conf) for conf in sorted(confs)] if self.config_store is not None else []
        )
        damage = next((d for d in damages if d), "")
        if damage:
            # A gate or trial on a version whose staged files changed would measure something else.
            return agent_pb2.CommandResult(
                status=agent_pb2.COMMAND_STATUS_REJECTED, message=f"NCCL_CONF_FILE: {damage}"
            )
        if self.backend.simulated:
            return run_simulated(
                command.run_benchmark, node_name=self.node_name, policy=self.policy, now_ns=time.time_ns()
            )
        return self._benchmarks().execute(
            command.run_benchmark,
            node_name=self.node_name,
            backend=self.backend,
            deadline_s=self._deadline(command),
            work_dir=self.work_dir,
        )

    def _probe(self, command: agent_pb2.Command) -> agent_pb2.CommandResult:
        if self.backend.simulated:
            return agent_pb2.CommandResult(
                status=agent_pb2.COMMAND_STATUS_REJECTED,
                message="a sim agent has no network to probe; the model's node-pair figures stand in",
            )
        return self._benchmarks().probe(
            command.probe,
            node_name=self.node_name,
            backend=self.backend,
            deadline_s=self._deadline(command),
            work_dir=self.work_dir,
        )

    async def run(self, command: agent_pb2.Command) -> agent_pb2.CommandResult:
        kind = command.WhichOneof("body")
        result = agent_pb2.CommandResult()
        try:
            if kind == "rediscover":
                topology = await asyncio.to_thread(self.discover)
                result.topology.CopyFrom(topology)
                result.status = agent_pb2.COMMAND_STATUS_SUCCEEDED
                result.message = f"{len(topology.gpus)} GPUs, {len(topology.nics)} NICs"
            elif kind == "drain":
                await asyncio.to_thread(self.journal.set_state, DRAINED_KEY, "1" if command.drain.drained else "0")
                result.status = agent_pb2.COMMAND_STATUS_SUCCEEDED
                result.message = "drained" if command.drain.drained else "undrained"
            elif kind == "cancel_job":
                await asyncio.to_thread(self._cancel, command.cancel_job, result)
            elif kind in ("run_benchmark", "probe") and self._deadline(command) <= 0:
                result.status = agent_pb2.COMMAND_STATUS_TIMED_OUT
                result.message = (
                    f"its deadline {command.deadline_at.ToDatetime(UTC).isoformat()} passed before it arrived; "
                    "nothing was started"
                )
            elif kind in ("run_benchmark", "probe") and self.drained:
                result.status = agent_pb2.COMMAND_STATUS_REJECTED
                result.message = "node is drained: it takes no benchmark work"
            elif kind == "apply_config" and self.config_store is not None:
                await self._apply_config(self.config_store, command.apply_config, result)
            elif kind in ("run_benchmark", "probe") and self._config_lock.locked():
                result.status = agent_pb2.COMMAND_STATUS_REJECTED
                result.message = "the node's config version is changing; try again"
            elif kind == "run_benchmark":
                result = await self._counted(self._benchmark, command)
            elif kind == "probe":
                result = await self._counted(self._probe, command)
            else:
                result.status = agent_pb2.COMMAND_STATUS_REJECTED
                result.message = f"this agent cannot run {kind or 'an empty'} command"
        except Exception as error:
            logger.exception("command failed", extra={"command": command.command_id})
            result = agent_pb2.CommandResult(status=agent_pb2.COMMAND_STATUS_FAILED)
            result.message = f"{error.__class__.__name__}: {error}"
        result.command_id = command.command_id
        result.message = _bounded(result.message)
        if not result.HasField("finished_at"):
            result.finished_at.FromDatetime(self.clock())
        return result

    async def _counted(
        self, work: Callable[[agent_pb2.Command], agent_pb2.CommandResult], command: agent_pb2.Command
    ) -> agent_pb2.CommandResult:
        self._benchmarks_running += 1  # while it is non-zero the node's config version does not change
        try:
            return await asyncio.to_thread(work, command)
        finally:
            self._benchmarks_running -= 1

    def _busy(self) -> str | None:
        return f"{self._benchmarks_running} benchmark job(s) running" if self._benchmarks_running else None

    async def _apply_config(
        self, store: ConfigStore, request: agent_pb2.ApplyConfig, result: agent_pb2.CommandResult
    ) -> None:
        async with self._config_lock:
            try:
                applied = await asyncio.to_thread(
                    store.apply, ConfigVersionId(request.version), dict(request.files), busy=self._busy
                )
            except ValidationError as error:
                result.status = agent_pb2.COMMAND_STATUS_REJECTED
                result.message = str(error)
                return
            except StoreBusy as error:
                result.status = agent_pb2.COMMAND_STATUS_FAILED
                result.message = str(error)
                return
            except ConfigWriteError as error:  # expected (a full disk): one line, no traceback; the old version stays
                logger.warning("config version %s not applied: %s", request.version or "defaults", error)
                result.status = agent_pb2.COMMAND_STATUS_FAILED
                result.message = f"config version {request.version or 'defaults'} not applied: {error}"
                return
        result.status = agent_pb2.COMMAND_STATUS_SUCCEEDED
        name, was = applied.version or "NCCL defaults", applied.previous or "NCCL defaults"
        result.message = f"{name} active (was {was})" if applied.changed else f"{name} already active"

    def applied_config_version(self) -> str:
        """The active version, for Register and Heartbeat ("" for NCCL's defaults or an untrusted pointer)."""
        if self.config_store is None:
            return ""
        try:
            return self.config_store.active_version()
        except ConflictError as error:
            logger.error("config store: %s", error)
            return ""

    def config_damage(self) -> str:
        """Why the active version's files no longer match its id, for Heartbeat ("" when intact).

        Logged when it changes; the controller answers a report by applying the version again.
        """
        damage = "" if self.config_store is None else _bounded(self.config_store.damage())
        if damage != self._reported_damage:
            if damage:
                logger.error("config store: %s", damage)
            else:
                logger.info("config store: the active version matches its id again")
            self._reported_damage = damage
        return damage


def _bounded(message: str) -> str:
    """``message``, cut to ``MAX_RESULT_MESSAGE`` characters; its start names the problem, so that is kept."""
    if len(message) <= MAX_RESULT_MESSAGE:
        return message
    kept = MAX_RESULT_MESSAGE - 64  # room for the note
    return f"{message[:kept]} ... ({len(message) - kept} characters left out)"
