"""Bearer-token authentication and TLS credentials, shared by both services and all their clients.

Every RPC on the agent and admin services must carry ``authorization: Bearer <token>``; the token is
compared in constant time. A missing or wrong token gets ``UNAUTHENTICATED`` with a fixed message, so a
caller learns nothing else (not which services exist, not whether the token was close). The standard
health service stays open: kubelet probes carry no credentials.

Non-goal: per-user identities or token rotation; one shared secret per cluster, delivered as a Kubernetes
Secret or a file.
"""

from __future__ import annotations

import abc
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from topo_tune.errors import ConfigError

HEALTH_PREFIX = "/grpc.health.v1.Health/"
_REFUSED = "missing or invalid bearer token"


def read_token(*, token_file: Path | None, token_env: str | None) -> str:
    """The token from ``--token-file`` (preferred) or the ``TOPO_TUNE_TOKEN`` value the CLI read."""
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError("--token-file", f"cannot read {token_file}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ConfigError("--token-file", f"{token_file} is not UTF-8 text") from None
        if not token:
            raise ConfigError("--token-file", f"{token_file} is empty")
        return token
    if token_env:
        return token_env.strip()
    raise ConfigError("--token-file", "no token: pass --token-file FILE or set TOPO_TUNE_TOKEN")


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def token_matches(expected: str, metadata: tuple[tuple[str, str | bytes], ...] | None) -> bool:
    presented = b""
    for key, value in metadata or ():
        if key == "authorization":
            raw = value.encode() if isinstance(value, str) else value
            presented = raw.removeprefix(b"Bearer ")
            break
    # compare_digest takes time independent of where the inputs differ.
    return hmac.compare_digest(presented, expected.encode())


class GuardInterceptor(grpc.aio.ServerInterceptor):
    """Answers every call but health checks with ``code`` unless ``admits`` lets it through."""

    code = grpc.StatusCode.UNAUTHENTICATED
    details = _REFUSED

    @abc.abstractmethod
    def admits(self, handler_call_details: grpc.HandlerCallDetails) -> bool:
        """Whether this call may go on to its handler."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if method.startswith(HEALTH_PREFIX) or handler is None or self.admits(handler_call_details):
            return handler
        return refusing_handler(handler, self.code, self.details)


class BearerTokenInterceptor(GuardInterceptor):
    """Refuses every call but health checks unless it carries the cluster's token."""

    def __init__(self, token: str) -> None:
        self._token = token

    def admits(self, handler_call_details: grpc.HandlerCallDetails) -> bool:
        return token_matches(self._token, handler_call_details.invocation_metadata)


def refusing_handler(
    like: grpc.RpcMethodHandler[Any, Any], code: grpc.StatusCode, details: str
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of ``like``'s shape that answers every call with ``code`` and ``details`` (interceptors)."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(code, details)

    # The replacement must have the original's streaming shape, or the server would wait for a
    # request message that a streaming client may never send. grpc.aio accepts a coroutine for a
    # streaming response: it aborts before anything is written.
    if like.request_streaming and like.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if like.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if like.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for TLS. Server: cert + key (+ client CA for mTLS). Client: CA (+ cert + key for mTLS)."""

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None


def _read(path: Path | None, flag: str) -> bytes | None:
    if path is None:
        return None
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(flag, f"cannot read {path}: {exc.strerror or exc}") from None
    if not data.strip():
        # gRPC's core aborts the whole process on an empty key or certificate chain.
        raise ConfigError(flag, f"{path} is empty")
    return data


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    cert, key = _read(tls.cert, "--tls-cert"), _read(tls.key, "--tls-key")
    if cert is None or key is None:
        raise ConfigError("--tls-cert", "TLS needs both --tls-cert and --tls-key")
    ca = _read(tls.ca, "--tls-client-ca")
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def channel_credentials(tls: TlsFiles) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca, "--tls-ca"),
        private_key=_read(tls.key, "--tls-key"),
        certificate_chain=_read(tls.cert, "--tls-cert"),
    )


def open_channel(
    address: str, *, tls: TlsFiles | None, options: list[tuple[str, Any]] | None = None
) -> grpc.aio.Channel:
    """An aio channel to ``address``: TLS when ``tls`` is given, plaintext otherwise."""
    if tls is not None:
        return grpc.aio.secure_channel(address, channel_credentials(tls), options=options)
    return grpc.aio.insecure_channel(address, options=options)
