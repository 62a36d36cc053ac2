"""The agent daemon: one long-lived session with the controller, rebuilt after every failure.

The agent dials out (nodes often cannot be reached from the controller's side), registers with its
topology, heartbeats, and executes the commands it is pushed. It survives controller restarts: the
connection is retried with capped exponential backoff and full jitter after whatever ended a session (any
exception that can heal, ``backoff.heals``; a refusal only the operator can fix, a wrong or another node's
token or an invalid registration, ends the agent with :class:`AgentRefused`), commands keep running while
the controller is away, and their results wait in the journal until a controller acknowledges them. The
agent never changes its node's configuration on its own because the controller is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import grpc
import grpc.aio

from topo_tune import __version__
from topo_tune.agent import discovery
from topo_tune.agent.backoff import Backoff, heals
from topo_tune.agent.bench.tuner_plugin import TunerPluginStage
from topo_tune.agent.command_executor import CommandExecutor
from topo_tune.agent.config_store import ConfigStore
from topo_tune.agent.journal import Entry, Journal
from topo_tune.agent.session_call import open_session
from topo_tune.agent.settings import AgentSettings
from topo_tune.benchmark.env_policy import EnvPolicy
from topo_tune.errors import AgentRefused, SessionRefused
from topo_tune.kube.rack import NodeRackReader
from topo_tune.security.auth import open_channel, read_token
from topo_tune.v1 import agent_pb2, agent_pb2_grpc, topology_pb2
from topo_tune.wire.values import BACKEND_TO_WIRE

logger = logging.getLogger(__name__)

_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
]


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        *,
        discover: Callable[[], topology_pb2.NodeTopology] = discovery.discover,
        rng: random.Random | None = None,
        rack_source: Callable[[], str] | None = None,
    ) -> None:
        self.settings = settings
        self.instance_id = uuid.uuid4().hex
        self.journal = Journal(settings.state_dir / "journal.sqlite3")
        self.rack = settings.rack
        """Sent at every registration: ``--rack``, else (in Kubernetes) the node's rack label."""
        if rack_source is None and not settings.rack and settings.kubernetes is not None and settings.rack_label:
            rack_source = NodeRackReader(
                environment=settings.kubernetes, node_name=settings.node_name, label=settings.rack_label
            )
        self._rack_source = rack_source
        self._token_used = ""
        self._refused: tuple[str, float] | None = None  # the token last refused, and since when
        self._discover = discover
        self.config_store = ConfigStore(settings.config_dir)
        # Candidate tuner tables of benchmark jobs: staged under the state directory, with the installed
        # plugin or one built there; the env policy admits exactly those directories.
        tuner_plugin = TunerPluginStage(
            installed_dirs=settings.plugin_dirs,
            build_dir=settings.state_dir / "plugin",
            table_dir=settings.state_dir / "tuner-tables",
        )
        self.executor = CommandExecutor(
            journal=self.journal,
            config_store=self.config_store,
            node_name=settings.node_name,
            backend=settings.backend,
            work_dir=settings.state_dir / "bench",
            policy=EnvPolicy(
                config_dirs=(settings.config_dir, tuner_plugin.table_dir), plugin_dirs=tuner_plugin.plugin_dirs
            ),
            tuner_plugin=tuner_plugin,
            bind_address=settings.address or "127.0.0.1",
            default_deadline_s=settings.benchmark_deadline_s,
            discover=self._discover_node,
            worker_env=settings.worker_env,
            ranks_per_gpu=settings.ranks_per_gpu,
            kept_worker_sets=settings.kept_worker_sets,
        )
        self._rng = rng or random.Random()
        self._backoff = Backoff(settings.backoff_initial_s, settings.backoff_max_s, self._rng)
        self._outgoing: asyncio.Queue[agent_pb2.AgentMessage] | None = None
        self._running: dict[str, asyncio.Task[None]] = {}
        self._taking: set[asyncio.Task[None]] = set()  # commands being taken (see ``_read_loop``)
        self._seq = 0
        self.sessions = 0
        """How many sessions reached ``Registered``."""
        self.registered = asyncio.Event()
        """Set while a session is registered (tests wait on it)."""

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set."""
        await self._finish_interrupted()
        try:
            await asyncio.to_thread(self.config_store.recover)  # an apply cut short leaves old or new; tidy up
            # Jobs on this host learn the node's name from here (`topo-tune env`'s default for --node).
            await asyncio.to_thread(self.config_store.record_node_name, self.settings.node_name)
        except OSError as error:
            # Not fatal: the agent still discovers and benchmarks; every ApplyConfig will fail with this reason.
            logger.error(
                "config directory %s is unusable: %s",
                self.settings.config_dir,
                error,
                extra={"node": self.settings.node_name},
            )
        topology = await asyncio.to_thread(self._discover_node)
        try:
            while not stop.is_set():
                reached = await self._session_guarded(topology, stop)
                if stop.is_set():
                    break
                if reached:
                    self._backoff.reset()
                delay = self._backoff.next_delay()
                logger.info("reconnecting in %.1f s", delay, extra={"node": self.settings.node_name})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
        finally:
            await asyncio.gather(*self._taking, return_exceptions=True)  # a command taken is running, or done
            # A benchmark's workers would outlive the agent otherwise, and its thread would hold the
            # process open until the job's deadline.
            self.executor.stop_benchmarks()
            for task in self._running.values():
                task.cancel()
            await asyncio.gather(*self._running.values(), return_exceptions=True)
            self.journal.close()

    def _discover_node(self) -> topology_pb2.NodeTopology:
        """Discovery, at start-up and on ``rediscover``; also re-reads the rack label (next registration)."""
        topology = self._discover()
        if self.settings.ranks_per_gpu > 1:
            topology.ranks_per_gpu = self.settings.ranks_per_gpu  # the controller places that many on each GPU
        if self._rack_source is not None:
            rack = self._rack_source()
            if rack != self.rack:
                logger.info("rack is now %r", rack, extra={"node": self.settings.node_name, "rack": rack})
                self.rack = rack
        return topology

    async def _finish_interrupted(self) -> None:
        for command_id in await asyncio.to_thread(self.journal.interrupted):
            result = agent_pb2.CommandResult(
                command_id=command_id,
                status=agent_pb2.COMMAND_STATUS_FAILED,
                message="the agent restarted while this command ran; it was not run again",
            )
            result.finished_at.FromDatetime(datetime.now(UTC))
            await asyncio.to_thread(self.journal.finish, result)
            logger.warning("interrupted command finished as failed", extra={"command": command_id})

    async def _session_guarded(self, topology: topology_pb2.NodeTopology, stop: asyncio.Event) -> bool:
        registered = False
        try:
            registered = await self._session(topology, stop)
        except grpc.aio.AioRpcError as error:
            if not heals(error.code(), registered=self.registered.is_set()) and not self._token_may_rotate(error):
                refused = self._refusal(error.code(), error.details() or "")
                logger.error("%s", refused, extra={"node": self.settings.node_name})
                raise refused from None
            else:
                logger.warning(
                    "session with %s ended: %s %s",
                    self.settings.controller,
                    error.code().name,
                    error.details(),
                    extra={"node": self.settings.node_name},
                )
            registered = self.registered.is_set() or registered
        except (SessionRefused, OSError) as error:
            logger.warning("session failed: %s", error, extra={"node": self.settings.node_name})
        except Exception as error:
            # Anything else a session meets (grpc's "RPC already finished" when the controller dies under a
            # write, a bad message, a bug) ends that session only: the agent reconnects. Only stop ends it.
            logger.warning(
                "session ended by an unexpected error: %s: %s",
                type(error).__name__,
                error,
                exc_info=error,
                extra={"node": self.settings.node_name},
            )
        finally:
            registered = registered or self.registered.is_set()
            self.registered.clear()
            self._outgoing = None
        return registered

    def _token_may_rotate(self, error: grpc.aio.AioRpcError) -> bool:
        """Whether a refused token from ``--token-file`` is still within ``token_grace_s`` (see the setting)."""
        if error.code() is not grpc.StatusCode.UNAUTHENTICATED or self.settings.token_file is None:
            return False
        now = asyncio.get_running_loop().time()
        if self._refused is None or self._refused[0] != self._token_used:
            self._refused = (self._token_used, now)
        left = self.settings.token_grace_s - (now - self._refused[1])
        if left <= 0:
            return False
        logger.warning(
            "the controller refused the token in %s; retrying for %.0f s more in case the file is rotated",
            self.settings.token_file,
            left,
            extra={"node": self.settings.node_name},
        )
        return True

    def _hierarchy(self) -> dict[str, str]:
        source = self._rack_source
        return dict(source.hierarchy) if isinstance(source, NodeRackReader) else {}

    def _refusal(self, code: grpc.StatusCode, details: str) -> AgentRefused:
        """One line naming what to fix: the token's flag or file, or the registration's flags."""
        node, controller = self.settings.node_name, self.settings.controller
        if self.settings.token_file is not None:
            source = f"--token-file {self.settings.token_file}"
        elif self.settings.token:
            source = "the token in $TOPO_TUNE_TOKEN"
        else:
            return AgentRefused(
                f"no token: pass --token-file or set $TOPO_TUNE_TOKEN (the controller at {controller} "
                "refused an agent without one)"
            )
        if code is grpc.StatusCode.UNAUTHENTICATED:
            return AgentRefused(f"{source} is not this cluster's credential for node {node} (refused by {controller})")
        if code is grpc.StatusCode.PERMISSION_DENIED:
            return AgentRefused(f"{source} is not a credential node {node} (--node-name) may use: {details}")
        return AgentRefused(
            f"the controller at {controller} refused to register node {node}: {details} "
            "(check --node-name, --rack and --label)"
        )

    def _register_message(self, topology: topology_pb2.NodeTopology) -> agent_pb2.AgentMessage:
        return agent_pb2.AgentMessage(
            register=agent_pb2.Register(
                node_name=self.settings.node_name,
                rack=self.rack,
                # The network tiers above the rack (kube.rack), under the labels the user gave.
                labels={**self._hierarchy(), **self.settings.labels},
                topology=topology,
                agent_version=__version__,
                backend=BACKEND_TO_WIRE[self.settings.backend],
                instance_id=self.instance_id,
                drained=self.executor.drained,
                address=self.settings.address,
                applied_config_version=self.executor.applied_config_version(),
            )
        )

    async def _session(self, topology: topology_pb2.NodeTopology, stop: asyncio.Event) -> bool:
        async with open_channel(self.settings.controller, tls=self.settings.tls, options=_CHANNEL_OPTIONS) as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            token = self.settings.token
            if self.settings.token_file is not None:
                token = await asyncio.to_thread(read_token, token_file=self.settings.token_file, token_env=None)
            self._token_used = token
            call = await open_session(stub, self._register_message(topology), token=token)
            first = await call.read()
            if not isinstance(first, agent_pb2.ControllerMessage) or first.WhichOneof("kind") != "registered":
                raise SessionRefused("the controller did not answer with Registered")
            interval_s = (first.registered.heartbeat_interval_ms / 1000) or self.settings.default_heartbeat_interval_s
            self.sessions += 1
            if not self.settings.address and first.registered.address != self.executor.bind_address:
                # Gloo must bind the address peers use; without --address, take the one the controller saw.
                self.executor.rebind(first.registered.address)
            self.registered.set()
            logger.info(
                "registered with controller %s",
                first.registered.controller_id,
                extra={"node": self.settings.node_name, "rack": first.registered.rack},
            )
            outgoing: asyncio.Queue[agent_pb2.AgentMessage] = asyncio.Queue()
            self._outgoing = outgoing
            for result in await asyncio.to_thread(self.journal.undelivered):
                outgoing.put_nowait(agent_pb2.AgentMessage(result=result))
            tasks = {
                asyncio.create_task(self._write_loop(call, outgoing), name="writer"),
                asyncio.create_task(self._read_loop(call), name="reader"),
                asyncio.create_task(self._heartbeat_loop(interval_s), name="heartbeat"),
                asyncio.create_task(stop.wait(), name="stop"),
            }
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                call.cancel()
            for task in done:
                if task.get_name() != "stop" and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            return True

    async def _write_loop(
        self,
        call: grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ControllerMessage],
        outgoing: asyncio.Queue[agent_pb2.AgentMessage],
    ) -> None:
        while True:
            message = await outgoing.get()
            await call.write(message)

    async def _heartbeat_loop(self, interval_s: float) -> None:
        while True:
            self._send_heartbeat()
            # ±10% jitter keeps a fleet that started together from heartbeating in lockstep.
            await asyncio.sleep(interval_s * self._rng.uniform(0.9, 1.1))

    def _send_heartbeat(self) -> None:
        self._seq += 1
        heartbeat = agent_pb2.Heartbeat(
            seq=self._seq,
            activity=self._activity(),
            running_command_ids=sorted(self._running),
            applied_config_version=self.executor.applied_config_version(),
            config_damage=self.executor.config_damage(),
        )
        heartbeat.sent_at.FromDatetime(datetime.now(UTC))
        self._send(agent_pb2.AgentMessage(heartbeat=heartbeat))

    def _activity(self) -> agent_pb2.AgentActivity.ValueType:
        if self._running:
            return agent_pb2.AGENT_ACTIVITY_BUSY
        if self.executor.drained:
            return agent_pb2.AGENT_ACTIVITY_DRAINED
        return agent_pb2.AGENT_ACTIVITY_IDLE

    def _send(self, message: agent_pb2.AgentMessage) -> None:
        # With no session the message is dropped: results wait in the journal, heartbeats are moot.
        if self._outgoing is not None:
            self._outgoing.put_nowait(message)

    async def _read_loop(
        self, call: grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ControllerMessage]
    ) -> None:
        while True:
            message = await call.read()
            if not isinstance(message, agent_pb2.ControllerMessage):
                return  # EOF: the controller closed the stream
            kind = message.WhichOneof("kind")
            if kind == "command":
                # Shielded: once the journal records a command as taken it must run, even if this session
                # ends while that is written; the controller's re-send would only find it taken.
                taking = asyncio.create_task(self._take(message.command))
                self._taking.add(taking)
                taking.add_done_callback(self._taking.discard)
                await asyncio.shield(taking)
            elif kind == "result_ack":
                await asyncio.to_thread(self.journal.delivered, message.result_ack.command_id)

    async def _take(self, command: agent_pb2.Command) -> None:
        taken = await asyncio.to_thread(self.journal.take, command.command_id)
        self._send(agent_pb2.AgentMessage(ack=agent_pb2.CommandAck(command_id=command.command_id)))
        if taken.entry is Entry.NEW:
            logger.info(
                "executing command %s (%s)",
                command.command_id,
                command.WhichOneof("body"),
                extra={"node": self.settings.node_name, "command": command.command_id},
            )
            self._running[command.command_id] = asyncio.create_task(self._execute(command))
        elif taken.entry is Entry.DONE and taken.result is not None:
            self._send(agent_pb2.AgentMessage(result=taken.result))

    async def _execute(self, command: agent_pb2.Command) -> None:
        try:
            result = await self.executor.run(command)
            await asyncio.to_thread(self.journal.finish, result)
            self._send(agent_pb2.AgentMessage(result=result))
        finally:
            self._running.pop(command.command_id, None)
        if command.WhichOneof("body") == "apply_config":
            self._send_heartbeat()  # the controller reconciles on the reported version: tell it now, not later
