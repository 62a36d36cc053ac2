"""Runs one command on this node and turns the outcome into a ``CommandResult``.

Each command kind has one handler. Handlers run in a worker thread (discovery and benchmarks block), never
raise (a failure becomes a ``failed`` result carrying the reason), and a drained node rejects benchmark
work. Kinds this agent cannot carry out are ``rejected`` with the reason, never silently dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from topo_tune.agent import discovery
from topo_tune.agent.journal import Journal
from topo_tune.v1 import agent_pb2, topology_pb2

logger = logging.getLogger(__name__)

DRAINED_KEY = "drained"


@dataclass
class Executor:
    journal: Journal
    discover: Callable[[], topology_pb2.NodeTopology] = discovery.discover
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    _benchmark_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def drained(self) -> bool:
        return self.journal.get_state(DRAINED_KEY) == "1"

    async def run(self, command: agent_pb2.Command) -> agent_pb2.CommandResult:
        kind = command.WhichOneof("body")
        result = agent_pb2.CommandResult(command_id=command.command_id)
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
            elif kind in ("run_benchmark", "probe") and self.drained:
                result.status = agent_pb2.COMMAND_STATUS_REJECTED
                result.message = "node is drained: it takes no benchmark work"
            else:
                result.status = agent_pb2.COMMAND_STATUS_REJECTED
                result.message = f"this agent cannot run {kind or 'an empty'} command"
        except Exception as error:
            logger.exception("command failed", extra={"command": command.command_id})
            result.status = agent_pb2.COMMAND_STATUS_FAILED
            result.message = f"{error.__class__.__name__}: {error}"
        result.finished_at.FromDatetime(self.clock())
        return result
