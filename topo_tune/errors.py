"""The exception tree of topo-tune, documented in one place.

    TopoTuneError                 base of everything topo-tune raises on purpose
    ├── ConfigError               bad cluster.yaml, settings or CLI value; carries the field path
    ├── ValidationError           a wire message or request that breaks the contract; carries the field path
    ├── SimInputError             a cluster description, environment or argument the simulator cannot use
    ├── NotFoundError             a node, command or other object that does not exist
    ├── PermissionDenied          the caller's credential does not allow this (e.g. an agent naming another node)
    ├── ConflictError             the request contradicts current state (e.g. same command id, other body)
    │   └── NodeBusy              a node runs another benchmark job (ABORTED: retry later)
    ├── StorageError              the database failed after retries
    ├── PluginBuildError          the NCCL tuner plugin could not be compiled (no compiler, failed compile)
    ├── KubernetesError           the Kubernetes API refused a request or could not be reached; carries the status
    └── ControllerError           talking to the controller failed (client side)
        ├── ControllerUnavailable the controller cannot be reached
        └── Unauthenticated       the controller refused the token

Servicers map these to gRPC status codes (``ValidationError`` → INVALID_ARGUMENT, ``NotFoundError`` →
NOT_FOUND, ``ConflictError`` → ALREADY_EXISTS / FAILED_PRECONDITION); clients map status codes back.
"""

from __future__ import annotations


class TopoTuneError(Exception):
    """Base class of every error topo-tune raises on purpose."""


class FieldError(TopoTuneError):
    """An error about one field of an input; ``str()`` is ``"<field>: <reason>"``."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}" if field else reason)


class ConfigError(FieldError):
    """A configuration file, setting or command-line value is invalid."""


class PermissionDenied(TopoTuneError):
    """The caller's credential does not allow this call or this node name."""


class ValidationError(FieldError):
    """A wire message or request breaks the contract."""


class SimInputError(FieldError):
    """The ``sim`` backend was given a cluster, environment or argument it cannot use; names the field."""


class NotFoundError(TopoTuneError):
    """The named object does not exist."""


class ConflictError(TopoTuneError):
    """The request contradicts the current state."""


class NodeBusy(ConflictError):
    """A node is running another benchmark job; the same request can succeed once it ends."""


class StorageError(TopoTuneError):
    """The database failed, after retries."""


class PluginBuildError(TopoTuneError):
    """The NCCL tuner plugin could not be built; the message says why and what to do."""


class KubernetesError(TopoTuneError):
    """A Kubernetes API request failed; ``status`` is the HTTP status, or None when there was no answer."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class ControllerError(TopoTuneError):
    """A call to the controller failed."""


class ControllerUnavailable(ControllerError):
    """The controller cannot be reached."""


class Unauthenticated(ControllerError):
    """The controller refused the bearer token (missing or wrong)."""
