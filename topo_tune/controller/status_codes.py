"""Domain errors → gRPC status codes: the one place the controller decides what a caller is told.

Never a blanket ``INTERNAL``: an unexpected exception is logged with its traceback and the caller gets
``INTERNAL`` with a fixed message, while every error topo-tune raises on purpose has its own code.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
import grpc.aio

from topo_tune.errors import (
    ConflictError,
    NodeBusy,
    NotFoundError,
    PermissionDenied,
    StorageError,
    TopoTuneError,
    ValidationError,
)

logger = logging.getLogger(__name__)

CODES: tuple[tuple[type[TopoTuneError], grpc.StatusCode], ...] = (
    (ValidationError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (NodeBusy, grpc.StatusCode.ABORTED),
    (ConflictError, grpc.StatusCode.ALREADY_EXISTS),
    (StorageError, grpc.StatusCode.UNAVAILABLE),
)


def code_for(error: TopoTuneError) -> grpc.StatusCode:
    for kind, code in CODES:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.FAILED_PRECONDITION


async def abort(context: grpc.aio.ServicerContext[Any, Any], error: BaseException) -> NoReturn:
    if isinstance(error, TopoTuneError):
        await context.abort(code_for(error), str(error))
    logger.exception("unexpected error in an RPC", exc_info=error)
    await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the controller's log")


Req = TypeVar("Req")
Resp = TypeVar("Resp")
Self = TypeVar("Self")


def maps_errors(
    method: Callable[[Self, Req, grpc.aio.ServicerContext[Req, Resp]], Awaitable[Resp]],
) -> Callable[[Self, Req, grpc.aio.ServicerContext[Req, Resp]], Awaitable[Resp]]:
    """Decorate a unary servicer method so domain errors become their status codes."""

    @functools.wraps(method)
    async def wrapper(self: Self, request: Req, context: grpc.aio.ServicerContext[Req, Resp]) -> Resp:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as error:
            await abort(context, error)

    return wrapper
