"""Bearer tokens on the wire, the guard that refuses calls before their body is read, and TLS credentials.

Every RPC on the agent and admin services must carry ``authorization: Bearer <token>`` (the ``Bearer ``
prefix is required); tokens are compared in constant time. A missing or wrong token gets
``UNAUTHENTICATED`` with a fixed message, so a caller learns nothing else (not which services or methods
exist, not whether the token was close). The standard health service stays open: kubelet probes carry no
credentials. Which token may call what (admin, agent, job) is the controller's ``credentials.py``.

Non-goal: token rotation; the admin token is one secret per cluster, delivered as a Kubernetes Secret or a
file.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from topo_tune.errors import ConfigError

HEALTH_PREFIX = "/grpc.health.v1.Health/"
REFUSED = "missing or invalid bearer token"
_BEARER = b"Bearer "


def read_token(
    *, token_file: Path | None, token_env: str | None, named_by: str = "--token-file", hint: str = ""
) -> str:
    """The token from ``--token-file`` (preferred) or the ``TOPO_TUNE_TOKEN`` value the CLI read.

    ``named_by`` is where the file's name came from (a flag or a cluster.yaml key): the error names it, with
    ``hint`` after the reason.
    """
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(named_by, f"cannot read {token_file}: {exc.strerror or exc}{hint}") from None
        except UnicodeDecodeError:
            raise ConfigError(named_by, f"{token_file} is not UTF-8 text{hint}") from None
        if not token:
            raise ConfigError(named_by, f"{token_file} is empty{hint}")
        return token
    if token_env:
        return token_env.strip()
    raise ConfigError("--token-file", "no token: pass --token-file FILE or set TOPO_TUNE_TOKEN")


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def presented_token(metadata: tuple[tuple[str, str | bytes], ...] | None) -> bytes | None:
    """The token of the call's ``authorization: Bearer <token>``; None without one (or without ``Bearer ``)."""
    for key, value in metadata or ():
        if key == "authorization":
            raw = value.encode() if isinstance(value, str) else value
            return raw[len(_BEARER) :] if raw.startswith(_BEARER) else None
    return None


class GuardInterceptor(grpc.aio.ServerInterceptor):
    """Answers every call but health checks with the status ``refusal`` names, before its body is read.

    A refused call never reaches its method's handler: it gets a handler that reads no request message, so
    an unauthenticated caller cannot make the server buffer or deserialize anything, and a method that does
    not exist is refused like any other (``UNIMPLEMENTED`` only for callers that may call).
    """

    @abc.abstractmethod
    async def refusal(self, handler_call_details: grpc.HandlerCallDetails) -> tuple[grpc.StatusCode, str] | None:
        """The code and message that refuse this call; None lets it go on."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method: str = handler_call_details.method
        if not method.startswith(HEALTH_PREFIX):
            refused = await self.refusal(handler_call_details)
            if refused is not None:
                return refusing_handler(*refused)
        return await continuation(handler_call_details)


def refusing_handler(code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler that answers with ``code`` and ``details`` without reading a request message.

    It takes the request as a stream (whatever the method's shape: the wire is the same) and never iterates
    it, so not one byte of the body is deserialized or held beyond HTTP/2's flow-control window.
    """

    async def refuse(_requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(code, details)

    return grpc.stream_stream_rpc_method_handler(refuse)


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


DEFAULT_PORT = 50051
"""The controller's gRPC port when an address names none (``controller.listen``'s default)."""


def with_default_port(address: str) -> str:
    """``address`` with ``DEFAULT_PORT`` when it names a host alone: ``localhost`` → ``localhost:50051``.

    gRPC's own default for a bare host is 443 (HTTPS), never where a controller listens. An address with a
    port, or in one of gRPC's URI forms (``dns:///…``, ``unix:…``), is used as written.
    """
    text = address.strip()
    if not text or "/" in text or text.startswith(("unix:", "unix-abstract:", "vsock:", "ipv4:", "ipv6:")):
        return text
    if text.startswith("["):  # [IPv6] or [IPv6]:port
        return text if "]:" in text else f"{text}:{DEFAULT_PORT}"
    if text.count(":") > 1:  # a bare IPv6 address
        return f"[{text}]:{DEFAULT_PORT}"
    host, sep, port = text.rpartition(":")
    return text if sep and host and port else f"{text.rstrip(':')}:{DEFAULT_PORT}"


def open_channel(
    address: str, *, tls: TlsFiles | None, options: list[tuple[str, Any]] | None = None
) -> grpc.aio.Channel:
    """An aio channel to ``address`` (``with_default_port``): TLS when ``tls`` is given, plaintext otherwise."""
    address = with_default_port(address)
    if tls is not None:
        return grpc.aio.secure_channel(address, channel_credentials(tls), options=options)
    return grpc.aio.insecure_channel(address, options=options)
