"""Opening an agent session: the controller accepts the call before the agent writes its registration.

grpc's asyncio client loses the server's status when a write is issued after the server has ended the call
(grpc/grpc#36066): the write fails and the call then reports ``INTERNAL: Internal error from Core`` instead
of the controller's UNAUTHENTICATED or PERMISSION_DENIED, so an agent with a wrong token read an error that
heals and retried. The controller sends its initial metadata as soon as it accepts the credential
(``AgentServicer.Session``), and the agent writes only after that. A refused call has ended by then, and
reading it raises the controller's own status.
"""

from __future__ import annotations

import grpc.aio

from topo_tune.security.auth import bearer_metadata
from topo_tune.v1 import agent_pb2, agent_pb2_grpc

SessionCall = grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ControllerMessage]


async def open_session(
    stub: agent_pb2_grpc.AgentServiceAsyncStub, first: agent_pb2.AgentMessage, *, token: str
) -> SessionCall:
    """A session call with ``first`` written, unless the controller refused the call (then reading raises)."""
    call: SessionCall = stub.Session(metadata=bearer_metadata(token))
    await call.initial_metadata()
    if not call.done():
        await call.write(first)
    return call
