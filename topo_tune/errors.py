"""The exception tree of topo-tune: every exception class of the package is defined here.

    TopoTuneError                 base of everything topo-tune raises on purpose
    ├── FieldError                an error about one field of an input; ``str()`` is "<field>: <reason>"
    │   ├── ConfigError           bad cluster.yaml, settings or CLI value
    │   │   └── UnsafeKnobError   a knob that can hang a job or corrupt data was asked to be searched
    │   ├── ValidationError       a wire message or request that breaks the contract
    │   │   └── RequestRefused    (client side) the controller refused a field of this client's request
    │   └── SimInputError         a cluster description, environment or argument the simulator cannot use
    ├── NotFoundError             a node, command or other object that does not exist
    ├── PermissionDenied          the caller's credential does not allow this (e.g. an agent naming another node)
    ├── QuotaExceeded             a credential's or a row's cap on what it may store is reached; names the cap
    ├── ConflictError             the request does not fit the current state (e.g. the node is drained)
    │   ├── AlreadyExists         the id names an object that exists already, with another body
    │   ├── NodeBusy              a node runs another benchmark job (retry later)
    │   └── StoreBusy             (agent) the node runs a benchmark or a job: its configuration must not change now
    ├── ConfigWriteError          (agent) the config directory cannot be written (disk full, quota, read-only)
    ├── FileWriteError            a file a user named cannot be written safely (a symlink there, a failed write)
    ├── StorageError              the database failed after retries
    │   ├── DatabaseFull          the disk under the database is full: writes fail at once, reads go on
    │   └── FencedError           a leader's write was refused: the database holds a newer leader's epoch
    ├── StaleTermError            a new leadership term is already behind the database's epoch
    ├── WatchEnded                a wait or watch stream cut short: the controller stopped leading or shut down
    ├── PluginBuildError          the NCCL tuner plugin could not be compiled (no compiler, failed compile)
    ├── KubernetesError           the Kubernetes API refused a request or could not be reached; carries the status
    ├── ControllerError           talking to the controller failed (client side)
    │   ├── ControllerUnavailable the controller cannot be reached, or answered that it cannot serve now
    │   │   └── ControllerDatabaseUnavailable  the controller answered: its database is unavailable
    │   ├── ControllerDatabaseFull the controller answered: its database's disk is full
    │   ├── Unauthenticated       the controller refused the token
    │   └── UnsafeAnswer          the controller answered a value a launcher must not get (a node name with a newline)
    ├── input that cannot be used (also ``ValueError``; the message names the field, line or entry):
    │   SpecError (benchmark job), SweepError (size sweep), EnvPolicyError (benchmark env),
    │   RecordError (plugin record line), TunerTableError (tuner table line), CpuListError (sysfs cpulist),
    │   YamlLimitError (YAML over a bound), PathError (a cluster.yaml check across fields),
    │   ClusterModelError (node/rack description), NcclXmlError (NCCL topology file),
    │   RingOrderError (ring problem matrices), WorkloadFileError (a trace, log or record to import)
    ├── the agent: LauncherBusy, JobCancelled, ForkServerError (benchmark launcher; also ``RuntimeError``),
    │   SessionRefused (the controller did not register the agent), AgentRefused (it refused the agent for
    │   good: a wrong or another node's credential, an invalid registration), NvmlCallError (one NVML call failed)
    ├── tuning: TrialFailed (one trial's benchmark), StudyError (a study cannot go on), StudyCancelled
    │   (an admin stopped a study), PassError (a tuning pass cannot go on), ExpertModeRequired
    │   (an NCCL graph file without expert mode; also ``RuntimeError``)
    └── a job's own A/B: MetricNotFound (a run printed no usable value of ``--metric``; names the run)

Servicers map these to gRPC status codes in one table (``controller/api/status_codes.py``: e.g. ``ValidationError``
→ INVALID_ARGUMENT, ``ConflictError`` → FAILED_PRECONDITION, ``AlreadyExists`` → ALREADY_EXISTS); the admin
client maps status codes back (``client/admin.py``). Non-goal: foreign exceptions (``OSError``, ``grpc.RpcError``)
are converted where they are caught, not wrapped here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

ERROR_KIND = "topo-tune-error"
"""The gRPC trailing-metadata key under which the controller names the class of an error it raised on purpose;
the transport never sets it, so a client tells "the controller answered" from "cannot reach it"."""
ERROR_FIELD = "topo-tune-field-bin"
"""The trailing-metadata key (binary: UTF-8) under which the controller names the field of a ``FieldError``, so
that a client splits ``"<field>: <reason>"`` without guessing (a reason may hold ": ", a field may be empty)."""

FailureKind = Literal["failed", "wrong_result", "timeout"]
FAILURE_KINDS: tuple[FailureKind, ...] = ("failed", "wrong_result", "timeout")


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


class UnsafeKnobError(ConfigError):
    """A knob that can hang a job or corrupt data was asked to be searched; the message says why not."""


class PermissionDenied(TopoTuneError):
    """The caller's credential does not allow this call or this node name."""


class QuotaExceeded(TopoTuneError):
    """A credential's or a row's cap on what it may store is reached; the message names the cap."""


class ValidationError(FieldError):
    """A wire message or request breaks the contract."""


class RequestRefused(ValidationError):
    """The controller refused a field of this client's request (its ``INVALID_ARGUMENT``): the field is the
    request's, which a CLI command names as the flag it came from. Not a reply this client found malformed."""


class SimInputError(FieldError):
    """The ``sim`` backend was given a cluster, environment or argument it cannot use; names the field."""


class NotFoundError(TopoTuneError):
    """The named object does not exist."""


class ConflictError(TopoTuneError):
    """The request does not fit the current state (a drained node, a rollout in another phase)."""


class AlreadyExists(ConflictError):
    """The request's id names an object that exists already with another body; use another id."""


class NodeBusy(ConflictError):
    """A node is running another benchmark job; the same request can succeed once it ends."""


class StoreBusy(ConflictError):
    """The node is running a benchmark or a job; its configuration must not change now."""


class ConfigWriteError(TopoTuneError):
    """(agent) The node's config directory cannot be written now: a full disk, a quota, a read-only file system or
    a permission; the message names the path. The active version is left as it was."""

    def __init__(self, message: str, *, errno: int) -> None:
        self.errno = errno
        super().__init__(message)


class FileWriteError(TopoTuneError):
    """A file a user named was not written: its path is a symbolic link or not a regular file, or writing failed.

    ``str()`` is ``"<path>: <reason>"``; the old file, if any, is as it was."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class StorageError(TopoTuneError):
    """The database failed, after retries."""


class DatabaseFull(StorageError):
    """The disk under the database is full: a write fails at once (no retry helps); the message names it."""


class FencedError(StorageError):
    """A leader's write was refused: the database holds another leader's epoch. Nothing was written."""

    def __init__(self, *, ours: int, current: int, holder: str) -> None:
        self.ours = ours
        self.current = current
        self.holder = holder
        super().__init__(
            f"fenced off: this controller led epoch {ours}, but the database is at epoch {current}"
            f" (claimed by {holder or 'an unnamed leader'}); nothing was written"
        )


class StaleTermError(TopoTuneError):
    """Raised by ``on_started_leading``: the term's epoch is already behind ``newer`` (seen where writes land)."""

    def __init__(self, *, epoch: int, newer: int) -> None:
        self.epoch = epoch
        self.newer = newer
        super().__init__(f"the term's epoch {epoch} is behind epoch {newer}")


class WatchEnded(TopoTuneError):
    """The controller stopped serving a watch (shutting down, or no longer the leader): watch again."""


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
    """The controller cannot be reached (or answered that it cannot serve now): the call may succeed later."""


class ControllerDatabaseUnavailable(ControllerUnavailable):
    """The controller answered, but its database is unavailable (a server restart, an outage)."""


class ControllerDatabaseFull(ControllerError):
    """The controller answered, but the disk under its database is full: writes fail until space is freed."""


class Unauthenticated(ControllerError):
    """The controller refused the bearer token (missing or wrong)."""


class UnsafeAnswer(ControllerError):
    """The controller answered a value a launcher, hostfile or shell must not be given (a node name that is not
    one, a master address with a space): nothing of the answer was used. Names the controller and the field."""


# Input that cannot be used. Also ValueError: parsers are called where a ValueError is the expected failure.


class SpecError(TopoTuneError, ValueError):
    """A benchmark job that cannot be run as given; the message names the field."""


class SweepError(TopoTuneError, ValueError):
    """A size sweep that cannot be run; the message names the field."""


@dataclass(frozen=True, slots=True)
class EnvViolation:
    """One key of a benchmark environment that was refused, and why."""

    key: str
    reason: str

    def __str__(self) -> str:
        plain = self.key.isascii() and self.key.isprintable() and " " not in self.key
        return f"{self.key if plain else repr(self.key)}: {self.reason}"


class EnvPolicyError(TopoTuneError, ValueError):
    """The environment was refused; ``violations`` lists every refused key with its reason."""

    def __init__(self, violations: Iterable[EnvViolation]) -> None:
        self.violations = tuple(violations)
        super().__init__("benchmark env refused: " + "; ".join(str(v) for v in self.violations))


class RecordError(TopoTuneError, ValueError):
    """A record line the plugin would not have written; the message names the line."""


class TunerTableError(TopoTuneError, ValueError):
    """A table line the plugin would skip; the message names the line and the field."""

    def __init__(self, source: str, line: int, reason: str) -> None:
        self.line = line
        self.reason = reason
        super().__init__(f"{source}:{line}: {reason}")


class CpuListError(TopoTuneError, ValueError):
    """A cpulist string that is not in the kernel's format."""


class PathError(TopoTuneError, ValueError):
    """A cluster.yaml check across fields that knows its own path (pydantic's is the model's)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(reason)
        self.path = path
        self.reason = reason


class YamlLimitError(TopoTuneError, ValueError):
    """The text exceeds one of the bounds; the message is one line."""


class WorkloadFileError(TopoTuneError, ValueError):
    """A workload file (trace, NCCL Inspector log, plugin record) that cannot be imported; names the file."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"{source}: {reason}")
        self.source = source
        self.reason = reason


class ClusterModelError(TopoTuneError, ValueError):
    """The node/rack description does not fit together; the message names the node or rack."""


class NcclXmlError(TopoTuneError, ValueError):
    """An NCCL topology file that cannot be read; the message names the line."""

    def __init__(self, message: str, *, line: int | None, source: str) -> None:
        where = f"{source}, line {line}" if line is not None else source
        super().__init__(f"{where}: {message}")
        self.line = line
        self.source = source


class RingOrderError(TopoTuneError, ValueError):
    """Input matrices that cannot describe a ring problem; the message names the argument and entry."""


# The agent.


class LauncherBusy(TopoTuneError, RuntimeError):
    """A benchmark job is already running on this node."""


class JobCancelled(TopoTuneError, RuntimeError):
    """The job was cancelled before it started here; nothing ran."""


class ForkServerError(TopoTuneError, RuntimeError):
    """The launcher's fork server did not start, or did not fork a worker (workers then start as interpreters)."""


class SessionRefused(TopoTuneError):
    """The controller answered the registration with something other than ``Registered``."""


class AgentRefused(TopoTuneError):
    """The controller refused this agent for a reason that retrying cannot heal (a wrong token, another node's
    credential, an invalid node name); ``str()`` is one line naming the flag or file to fix."""


class NvmlCallError(TopoTuneError):
    """One NVML call failed; ``message`` is NVML's own wording (e.g. "Not Supported")."""

    def __init__(self, call: str, code: int, message: str) -> None:
        super().__init__(f"{call}: {message} (NVML error {code})")
        self.call = call
        self.code = code
        self.message = message


# Tuning.


class TrialFailed(TopoTuneError):
    """Raised by an evaluator when a trial's benchmark failed, returned a wrong result or timed out."""

    def __init__(self, reason: str, *, kind: FailureKind = "failed") -> None:
        if kind not in FAILURE_KINDS:
            raise ValueError(f"kind must be one of {FAILURE_KINDS}, got {kind!r}")
        self.reason = reason
        self.kind: FailureKind = kind
        super().__init__(f"{kind}: {reason}")


class StudyError(TopoTuneError):
    """The study cannot go on (the baseline failed, or the stored study belongs to another space)."""


class StudyCancelled(TopoTuneError):
    """Raised inside a study's thread when ``admin study cancel`` stops it."""


class PassError(TopoTuneError):
    """The pass cannot go on; the message says which node or step."""


class ExpertModeRequired(TopoTuneError, RuntimeError):
    """Rendering an NCCL graph file was asked for without the explicit expert mode."""


class MetricNotFound(TopoTuneError):
    """A run of ``exec --compare`` printed no usable value of ``--metric``; the message names the run."""
