"""Domain errors → gRPC status codes: the one place the controller decides what a caller is told.

Never a blanket ``INTERNAL``: an unexpected exception is logged with its traceback and the caller gets
``INTERNAL`` with a fixed message, while every error topo-tune raises on purpose has its own code.
Every answer for an error raised on purpose carries the error's class name in the trailing metadata
(``ERROR_KIND``), so a client tells "the controller answered: its database is unavailable" apart from an
UNAVAILABLE that gRPC itself reports when the controller cannot be reached; an error about one field names
the field there too (``ERROR_FIELD``), so a client can say it in its own terms (the CLI: the flag).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
import grpc.aio

from topo_tune import errors
from topo_tune.controller.db.database import answering_a_caller

logger = logging.getLogger(__name__)

C = grpc.StatusCode
CODES: dict[type[errors.TopoTuneError], grpc.StatusCode] = {
    errors.TopoTuneError: C.FAILED_PRECONDITION,
    # The caller's input: the message names the field, line or entry.
    errors.FieldError: C.INVALID_ARGUMENT,
    errors.SpecError: C.INVALID_ARGUMENT,
    errors.SweepError: C.INVALID_ARGUMENT,
    errors.EnvPolicyError: C.INVALID_ARGUMENT,
    errors.RecordError: C.INVALID_ARGUMENT,
    errors.TunerTableError: C.INVALID_ARGUMENT,
    errors.CpuListError: C.INVALID_ARGUMENT,
    errors.YamlLimitError: C.INVALID_ARGUMENT,
    errors.PathError: C.INVALID_ARGUMENT,
    errors.ClusterModelError: C.INVALID_ARGUMENT,
    errors.NcclXmlError: C.INVALID_ARGUMENT,
    errors.RingOrderError: C.INVALID_ARGUMENT,
    errors.WorkloadFileError: C.INVALID_ARGUMENT,
    errors.NotFoundError: C.NOT_FOUND,
    errors.PermissionDenied: C.PERMISSION_DENIED,
    errors.Unauthenticated: C.UNAUTHENTICATED,
    # The state: wrong now (a drained node), taken (an id), or busy (the same call can succeed later).
    errors.ConflictError: C.FAILED_PRECONDITION,
    errors.AlreadyExists: C.ALREADY_EXISTS,
    errors.NodeBusy: C.ABORTED,
    errors.StoreBusy: C.ABORTED,
    errors.LauncherBusy: C.ABORTED,
    errors.StudyCancelled: C.CANCELLED,
    errors.JobCancelled: C.CANCELLED,
    # Somewhere else is away: the caller retries, or goes to the new leader.
    errors.StorageError: C.UNAVAILABLE,
    errors.ForkServerError: C.UNAVAILABLE,  # (agent) workers could not be started here now
    # A full disk stays full until someone frees space: no retry helps, so not UNAVAILABLE.
    errors.DatabaseFull: C.RESOURCE_EXHAUSTED,
    # A cap on what one credential or one row may store: nothing was stored; deleting, or retention, frees room.
    errors.QuotaExceeded: C.RESOURCE_EXHAUSTED,
    errors.StaleTermError: C.UNAVAILABLE,
    errors.WatchEnded: C.UNAVAILABLE,
    errors.KubernetesError: C.UNAVAILABLE,
    errors.ControllerError: C.UNAVAILABLE,
}
"""Each class's code; a class not listed takes its nearest listed base's (``TopoTuneError``: FAILED_PRECONDITION)."""


def code_for(error: errors.TopoTuneError) -> grpc.StatusCode:
    for kind in type(error).__mro__:
        if kind in CODES:
            return CODES[kind]
    raise AssertionError(f"{type(error).__name__} is not a TopoTuneError")


async def abort(context: grpc.aio.ServicerContext[Any, Any], error: BaseException) -> NoReturn:
    """End the call with ``error``'s status.

    gRPC keeps the abort's exception on the call's state, and its traceback holds the frames up to here: a
    reference cycle that only a full garbage collection frees (and the heap keeper may freeze it first). The
    error's own traceback (the servicer's frames, the request among their locals) is therefore dropped once
    logged, and the callers drop their reference to the request before they abort: a refused 15 MiB request
    is freed when its call ends, not held until a full collection."""
    if not isinstance(error, errors.TopoTuneError):
        logger.exception("unexpected error in an RPC", exc_info=error)
        error.__traceback__ = None
        await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the controller's log")
    error.__traceback__ = None
    metadata: list[tuple[str, str | bytes]] = [(errors.ERROR_KIND, type(error).__name__)]
    if isinstance(error, errors.FieldError):
        metadata.append((errors.ERROR_FIELD, error.field.encode()))
    await context.abort(code_for(error), str(error), trailing_metadata=tuple(metadata))


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
            with answering_a_caller():
                return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as error:
            del request  # see ``abort``: this frame lives on in a reference cycle; the request must not
            await abort(context, error)

    return wrapper


def maps_stream_errors(
    method: Callable[[Self, Req, grpc.aio.ServicerContext[Req, Resp]], AsyncIterator[Resp]],
) -> Callable[[Self, Req, grpc.aio.ServicerContext[Req, Resp]], AsyncIterator[Resp]]:
    """Decorate a server-streaming servicer method so domain errors become their status codes."""

    @functools.wraps(method)
    async def wrapper(self: Self, request: Req, context: grpc.aio.ServicerContext[Req, Resp]) -> AsyncIterator[Resp]:
        try:
            with answering_a_caller():
                async for item in method(self, request, context):
                    yield item
        except grpc.aio.AbortError:
            raise
        except Exception as error:
            del request  # see ``abort``: this frame lives on in a reference cycle; the request must not
            await abort(context, error)

    return wrapper
