"""A refused request is freed when its call ends, not held by the abort until a full garbage collection.

gRPC keeps an abort's exception on the call's state, and that exception's traceback and context hold the
frames that raised it: a reference cycle. Were the request among those frames' locals, every refused
15 MiB request would stay in memory until the cyclic collector ran (or for good, once the heap keeper froze
it). These tests run with the collector off, so that only reference counting frees anything.
"""

from __future__ import annotations

import gc
import logging
import weakref
from collections.abc import Iterator
from typing import Any

import grpc
import grpc.aio
import pytest

from topo_tune.controller.api.request_decoding import _coroutine
from topo_tune.controller.api.status_codes import maps_errors
from topo_tune.errors import ValidationError


class Request:
    """Stands for a parsed 15 MiB request (protobuf messages take no weak references)."""


class Context:
    """Aborts as grpc.aio's servicer context does: the exception it raises is kept on the call's state."""

    kept: grpc.aio.AbortError | None = None

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        self.kept = grpc.aio.AbortError()
        raise self.kept


class Servicer:
    @maps_errors
    async def Put(self, request: Request, context: Any) -> None:
        raise ValidationError("files['nccl.conf']", "larger than 1048576 bytes")

    @maps_errors
    async def Broken(self, request: Request, context: Any) -> None:
        raise RuntimeError("a bug")


@pytest.fixture(autouse=True)
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("method", ["Put", "Broken"], ids=["refused", "unexpected-error"])
async def test_a_refused_request_is_freed_while_the_abort_is_still_kept(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test's log capture keeps every record, tracebacks included; a daemon's handler writes and drops them.
    monkeypatch.setattr(logging.getLogger("topo_tune.controller.api.status_codes"), "disabled", True)
    context, request = Context(), Request()
    freed = weakref.ref(request)
    with pytest.raises(grpc.aio.AbortError):
        await getattr(Servicer(), method)(request, context)
    del request
    assert context.kept is not None, "the abort is still held, as by the call's state"
    assert freed() is None, "the abort's frames hold the request"


async def test_the_decoding_interceptor_s_handler_does_not_hold_it_either() -> None:
    context, request = Context(), Request()
    freed = weakref.ref(request)
    handle = _coroutine(Servicer().Put)
    with pytest.raises(grpc.aio.AbortError):
        await handle(request, context)
    del request
    assert freed() is None
