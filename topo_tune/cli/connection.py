"""Options shared by every command that talks to a controller, and the token/TLS they resolve to."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from topo_tune.security.auth import TlsFiles, read_token

F = TypeVar("F", bound=Callable[..., Any])

_PATH = click.Path(path_type=Path, dir_okay=False)
TOKEN_ENVVAR = "TOPO_TUNE_TOKEN"
"""Read by every command with ``--token-file`` when the flag is not given (the token itself is never a flag)."""


def controller_option(function: F) -> F:
    """``--controller HOST[:PORT]`` (``$TOPO_TUNE_CONTROLLER``), passed as ``address``."""
    return click.option(
        "--controller",
        "address",
        envvar="TOPO_TUNE_CONTROLLER",
        default="127.0.0.1:50051",
        show_default=True,
        help="HOST[:PORT] of the controller; the port is 50051 when left out [$TOPO_TUNE_CONTROLLER].",
    )(function)


def token_options(function: F) -> F:
    # No --token: a value in argv is visible to every user of the machine (ps, /proc/PID/cmdline).
    return click.option("--token-file", type=_PATH, help="File holding the bearer token (default: $TOPO_TUNE_TOKEN).")(
        function
    )


def client_tls_options(function: F) -> F:
    function = click.option("--tls-ca", type=_PATH, help="CA bundle to verify the controller (enables TLS).")(function)
    function = click.option("--tls-cert", type=_PATH, help="Client certificate, for mTLS.")(function)
    return click.option("--tls-key", type=_PATH, help="Client key, for mTLS.")(function)


def resolve_token(token_file: Path | None, *, configured: Path | None = None, configured_as: str = "") -> str:
    """The token from ``--token-file``, else ``$TOPO_TUNE_TOKEN``, else the file cluster.yaml names.

    ``configured`` is that file (its key in cluster.yaml: ``configured_as``). The explicit flag wins over the
    environment and the environment over the file's setting, so ``export TOPO_TUNE_TOKEN=...`` works with a
    cluster.yaml written for the service, whose token file this machine may not have.
    """
    if token_file is not None:
        return read_token(token_file=token_file, token_env=None)
    from_env = os.environ.get(TOKEN_ENVVAR, "").strip()
    if from_env or configured is None:
        return read_token(token_file=None, token_env=from_env)
    hint = f" (from {configured_as}; {TOKEN_ENVVAR} is unset: set it or pass --token-file to use another token)"
    return read_token(token_file=configured, token_env=None, named_by=configured_as, hint=hint)


def client_tls(ca: Path | None, cert: Path | None, key: Path | None) -> TlsFiles | None:
    if ca is None and cert is None and key is None:
        return None
    if (cert is None) != (key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    return TlsFiles(cert=cert, key=key, ca=ca)
