"""Request bodies that are not the message their method takes: ``INVALID_ARGUMENT`` and one log line.

gRPC deserializes a unary request before the servicer method runs, so a ``DecodeError`` there never reaches
``status_codes``: the server logs a traceback and answers ``UNKNOWN``. ``DecodingInterceptor`` wraps the
deserializer of every method whose request is a single message, once for all services: bytes that do not
parse become a marker, and the wrapped handler answers the marker with the status ``status_codes`` gives a
``ValidationError``. Streamed requests are decoded as the servicer reads them; ``AgentService.Session``
handles that itself.

A method whose checks make its largest valid request a fraction of the server's receive limit
(``validation.REQUEST_BYTES``: a config version's files hold at most 1 MiB each) has a body above that size
refused by its length alone: not parsed, decoded and checked first (for a 15 MiB version: about 60 MiB
allocated and freed per call, which the allocator kept for a while). Non-goal: checking the content of a
message that parses (``validation.py``).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from topo_tune.controller.api import status_codes, validation
from topo_tune.errors import ValidationError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Undecodable:
    """What the wrapped deserializer returns for bytes that are not the method's request message."""

    method: str
    why: str
    """What is wrong with the body, as the caller is told."""


def _deserializer(method: str, parse: Callable[[bytes], Any] | None, most: int | None) -> Callable[[bytes], Any]:
    name = method.rpartition("/")[2]

    def deserialize(data: bytes) -> Any:
        if parse is None:
            return data
        if most is not None and len(data) > most:
            return _Undecodable(method, f"the body is {len(data):,} bytes; a valid {name} request is at most {most:,}")
        try:
            return parse(data)
        except DecodeError:
            return _Undecodable(method, f"the body is not a valid {name} request message")

    return deserialize


async def _refuse(context: grpc.aio.ServicerContext[Any, Any], request: _Undecodable) -> None:
    logger.warning("refused a request to %s: %s", request.method, request.why)
    await status_codes.abort(context, ValidationError("request", request.why))


def _coroutine(behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A handler that returns its answer, or writes its stream with ``context.write``."""

    async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, _Undecodable):
            await _refuse(context, request)
        try:
            return await behavior(request, context)
        except BaseException:
            del request  # the abort's traceback keeps this frame: it must not keep the request (status_codes.abort)
            raise

    return handle


def _generator(behavior: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """A handler that yields its stream."""

    async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        if isinstance(request, _Undecodable):
            await _refuse(context, request)
        try:
            async for item in behavior(request, context):
                yield item
        except BaseException:
            del request  # as above
            raise

    return handle


class DecodingInterceptor(grpc.aio.ServerInterceptor):
    """Gives every unary-request method a deserializer that cannot raise and a handler that refuses its marker.

    ``request_bytes``: the largest body each method named in it may have (default ``validation.REQUEST_BYTES``).
    """

    def __init__(self, request_bytes: Mapping[str, int] = validation.REQUEST_BYTES) -> None:
        self._request_bytes = request_bytes

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        method: str = handler_call_details.method
        deserializer = _deserializer(method, handler.request_deserializer, self._request_bytes.get(method))
        if handler.response_streaming:
            behavior: Any = handler.unary_stream  # an aio handler, though grpc's stubs type the sync one
            wrapped = _generator(behavior) if inspect.isasyncgenfunction(behavior) else _coroutine(behavior)
            return grpc.unary_stream_rpc_method_handler(
                wrapped, request_deserializer=deserializer, response_serializer=handler.response_serializer
            )
        return grpc.unary_unary_rpc_method_handler(
            _coroutine(handler.unary_unary),  # type: ignore[arg-type]
            request_deserializer=deserializer,
            response_serializer=handler.response_serializer,
        )
