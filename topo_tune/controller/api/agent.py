"""The agent-facing servicer: stream plumbing and error mapping around ``SessionHub``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from topo_tune.controller.api import status_codes, validation
from topo_tune.controller.credentials import Credentials
from topo_tune.controller.sessions import AgentSession, SessionHub
from topo_tune.errors import PermissionDenied, TopoTuneError, ValidationError
from topo_tune.security.log_text import printable
from topo_tune.v1 import agent_pb2, agent_pb2_grpc

logger = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 30.0
NOT_AN_AGENT_MESSAGE = "the bytes received are not an AgentMessage"


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, hub: SessionHub, credentials: Credentials | None = None) -> None:
        self._hub = hub
        self._credentials = credentials
        """Given: a session registers only as the node its credential names (admins as any)."""

    async def Session(
        self,
        request_iterator: AsyncIterator[agent_pb2.AgentMessage],
        context: grpc.aio.ServicerContext[agent_pb2.AgentMessage, agent_pb2.ControllerMessage],
    ) -> AsyncIterator[agent_pb2.ControllerMessage]:
        # The credential passed the guard: say so before the first read (see agent/session_call.py).
        await context.send_initial_metadata(())
        incoming = aiter(request_iterator)
        try:
            first = await asyncio.wait_for(anext(incoming), REGISTER_TIMEOUT_S)
        except StopAsyncIteration:
            return
        except TimeoutError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "register: not sent within 30 s")
        except DecodeError:
            self._hub.metrics.rejected_messages.inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"register: {NOT_AN_AGENT_MESSAGE}")
        if first.WhichOneof("kind") != "register":
            self._hub.metrics.rejected_messages.inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "register: the first message must register")
        credential = None
        if self._credentials is not None:
            credential = await self._credentials.of_call(context.invocation_metadata())
            if credential is None or not credential.may_register_as(first.register.node_name):
                # Before the registry is touched: the node's own session stays up.
                self._hub.metrics.rejected_messages.inc()
                bound = f"node {credential.node_name!r}" if credential is not None else "no node"
                asked = first.register.node_name
                await status_codes.abort(
                    context,
                    PermissionDenied(f"register: this credential is for {bound}; it cannot register as {asked!r}"),
                )
        try:
            validation.register(first.register)
            session, registered = await self._hub.open(first.register, peer_host=peer_host(context.peer()))
            session.credential_id = credential.id if credential is not None else ""
        except TopoTuneError as error:
            if isinstance(error, ValidationError):
                self._hub.metrics.rejected_messages.inc()
            await status_codes.abort(context, error)
        failure: list[TopoTuneError] = []
        reader = asyncio.create_task(self._read(session, incoming, failure))
        try:
            yield registered
            await self._hub.resend_outstanding(session)
            while (message := await session.outgoing.get()) is not None:
                yield message
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            self._hub.close(session)
        if failure:
            await status_codes.abort(context, failure[0])
        if session.denied:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, session.close_reason)
        if session.close_reason and session.close_reason != "agent closed the stream":
            await context.abort(grpc.StatusCode.UNAVAILABLE, session.close_reason)

    async def _read(
        self,
        session: AgentSession,
        incoming: AsyncIterator[agent_pb2.AgentMessage],
        failure: list[TopoTuneError],
    ) -> None:
        try:
            async for message in incoming:
                await self._hub.handle(session, validation.agent_message(message))
            session.close("agent closed the stream")
        except TopoTuneError as error:
            if isinstance(error, ValidationError):
                self._hub.metrics.rejected_messages.inc()
            logger.warning("closing session: %s", printable(str(error)), extra={"node": session.node_name})
            failure.append(error)
            session.close(str(error))
        except DecodeError:
            # gRPC deserializes each frame as the stream is read; bytes of some other message are bad input.
            self._hub.metrics.rejected_messages.inc()
            logger.warning("closing session: %s", NOT_AN_AGENT_MESSAGE, extra={"node": session.node_name})
            failure.append(ValidationError("message", NOT_AN_AGENT_MESSAGE))
            session.close(NOT_AN_AGENT_MESSAGE)
        except grpc.aio.AioRpcError:
            session.close("agent closed the stream")
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("unexpected error handling an agent message", extra={"node": session.node_name})
            session.close("internal error")


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string: ``ipv4:10.0.0.5:4242`` → ``10.0.0.5``, ``ipv6:[::1]:4242`` → ``::1``."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return ""
