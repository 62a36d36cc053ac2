"""Which environment variables a benchmark job or a config version may set: an allow-list by name.

The agent runs privileged on every GPU node, so a benchmark's environment must not become a way to
run code, write files or hang the fabric there (architecture invariant 9). Every accepted name is a
variable of the catalogue (``topo_tune/nccl/variables.py``) with the type of value it takes
(``knobs/value_types.py``); a name not listed is refused with the reason, so a variable a future NCCL adds
(one that loads a library, say ``NCCL_IBVERBS_LIB``) is refused until someone has read what it does and
listed it. Knobs that hang or corrupt data beyond some values accept only the safe ones (NCCL_FACTS §1.3).

This module adds what needs the agent's directories: plugin and input-file paths must lie inside them
(``NCCL_GRAPH_FILE`` also needs expert mode), output files (debug log, dumps) are bare names the agent
rewrites into the job's own directory (:meth:`EnvPolicy.confine`; a config version may not set one: it
would make every job write a file), and a socket thread product above 64 is refused. Loader, interpreter
and placement variables are refused with their own reason, so an attempt is obvious in the logs.

Non-goals: choosing values (the tuner's search space) or checking that values are the same on every rank
(the controller sends one environment to all ranks).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from topo_tune.errors import EnvPolicyError, EnvViolation
from topo_tune.nccl import variables as catalogue
from topo_tune.nccl.value_types import DECIMAL, InputFile, OutputFile, Plugin, ValueType

__all__ = [
    "OUTPUT_DIR",
    "VARIABLES",
    "EnvPolicy",
    "EnvPolicyError",
    "EnvViolation",
]

OUTPUT_DIR = "out"
"""The job directory's subdirectory that :class:`OutputFile` variables are rewritten into."""

_KEY_RE = re.compile(r"^[A-Z][A-Z0-9_]*\Z")
_FILE_NAME_RE = re.compile(r"^[A-Za-z0-9_%][A-Za-z0-9_.%-]{0,127}\Z")  # no '/', no leading '.': stays put
_MAX_VALUE_LEN = 1023  # NCCL keeps 1023 characters of a key or value read from nccl.conf

_LOADER_INTERPRETER_EXACT = frozenset(
    {
        "PATH",
        "BASH_ENV",
        "ENV",
        "IFS",
        "SHELLOPTS",
        "PERL5LIB",
        "PERL5OPT",
        "RUBYOPT",
        "RUBYLIB",
        "NODE_OPTIONS",
        "JAVA_TOOL_OPTIONS",
        "GCONV_PATH",
        "HOSTALIASES",
    }
)
_LOADER_INTERPRETER_PREFIXES = ("LD_", "PYTHON", "DYLD_", "MALLOC_", "GLIBC_")
_PLACEMENT_KEYS = frozenset(
    {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "ROCR_VISIBLE_DEVICES"}
)
_SOCKET_THREAD_PRODUCT_MAX = 64

VARIABLES: Mapping[str, ValueType] = catalogue.CATALOGUE.value_types
"""Every variable a job or a config version may set, with the values it may take (from the catalogue)."""


def _value_type(key: str) -> ValueType | None:
    # Read at call time, so a catalogue extended in a test is the one the policy enforces.
    variable = catalogue.CATALOGUE.get(key)
    return None if variable is None else variable.type


_REFUSED_WHY = {
    "NCCL_COMM_ID": "the rendezvous is chosen by the agent from the job, not from the environment",
    "NCCL_IBVERBS_LIB": "NCCL dlopen()s this library: it would run code as the agent",
}


def _inside(value: str, roots: Iterable[Path]) -> bool:
    # realpath resolves symlinks and '..' so a link inside the directory cannot point out; the
    # comparison is by path components (Path.parents), so /x/plugins-evil is not inside /x/plugins.
    target = Path(os.path.realpath(value))
    for root in roots:
        real_root = Path(os.path.realpath(root))
        if target == real_root or real_root in target.parents:
            return True
    return False


@dataclass(frozen=True, slots=True)
class EnvPolicy:
    """The agent's policy; its directories come from the agent's own configuration."""

    config_dirs: tuple[Path, ...] = ()
    """Directories whose files :class:`InputFile` variables may name (e.g. the agent's config dir)."""
    plugin_dirs: tuple[Path, ...] = ()
    """Directories whose shared objects ``NCCL_*_PLUGIN`` variables may name."""
    expert_mode: bool = False
    """Allow ``NCCL_GRAPH_FILE`` (inside ``config_dirs``)."""
    node_paths: bool = True
    """False where the node's directories are unknown (the controller checking a pushed version): a path
    then only has to be absolute and normalised; the node checks it against its directories at apply."""

    def check(self, env: Mapping[str, str]) -> None:
        """Raise ``EnvPolicyError`` listing every refused key; return quietly if all are allowed."""
        self._raise([v for key in sorted(env) if (v := self.violation(key, env[key], env)) is not None])

    def check_config(self, settings: Mapping[str, str]) -> None:
        """Like :meth:`check`, for a config version's ``nccl.conf``: also refuses every output file.

        A version's settings reach every job of every node it is rolled out to, with no job directory to
        confine a debug or dump file to, so none may be set there.
        """
        violations = []
        for key in sorted(settings):
            violation = self.violation(key, settings[key], settings)
            if violation is None and isinstance(_value_type(key), OutputFile):
                violation = EnvViolation(key, "a config version may not make every job write a file")
            if violation is not None:
                violations.append(violation)
        self._raise(violations)

    @staticmethod
    def _raise(violations: list[EnvViolation]) -> None:
        if violations:
            raise EnvPolicyError(violations)

    def violation(self, key: str, value: str, env: Mapping[str, str]) -> EnvViolation | None:
        reason = self._reason(key, value, env)
        return None if reason is None else EnvViolation(key, reason)

    def _reason(self, key: str, value: str, env: Mapping[str, str]) -> str | None:
        if not _KEY_RE.match(key):
            return "not a valid variable name (upper-case letters, digits and '_')"
        if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
            return "the value contains control characters"
        if len(value) > _MAX_VALUE_LEN:
            return f"the value is longer than {_MAX_VALUE_LEN} characters"
        if key in _LOADER_INTERPRETER_EXACT or key.startswith(_LOADER_INTERPRETER_PREFIXES):
            return "loader/interpreter variables are never accepted (they load or run code)"
        if key in _PLACEMENT_KEYS:
            return "GPU placement comes from the job's rank map, not from the environment"
        if key in _REFUSED_WHY:
            return _REFUSED_WHY[key]
        kind = _value_type(key)
        if kind is None:
            return "not allow-listed: not an NCCL/torch variable topo-tune knows (docs/security.md lists them)"
        return self._value_reason(key, kind, value, env)

    def _value_reason(self, key: str, kind: ValueType, value: str, env: Mapping[str, str]) -> str | None:
        if isinstance(kind, Plugin):
            if value.lower() == "none":
                return None
            return self._path_reason(value, self.plugin_dirs, "plugin")
        if isinstance(kind, InputFile):
            if kind.expert and not self.expert_mode:
                return f"{key} is for experiments only and needs the agent's expert mode"
            return self._path_reason(value, self.config_dirs, "config")
        if isinstance(kind, OutputFile):
            if not _FILE_NAME_RE.match(value):
                return (
                    "give a bare file name (letters, digits, '.', '_', '-', '%'); "
                    "the agent writes it into the job's own directory"
                )
            return None
        reason = kind.reason(value)
        if reason is None and key in ("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"):
            return _socket_product_reason(env)
        return reason

    def _path_reason(self, value: str, roots: tuple[Path, ...], kind: str) -> str | None:
        if not os.path.isabs(value):
            return f"must be an absolute path inside the agent's {kind} directories"
        if not self.node_paths:
            return None if os.path.normpath(value) == value else f"{value!r} is not a normalised path"
        if _inside(value, roots):
            return None
        where = ", ".join(str(r) for r in roots) or "none configured"
        return f"{value!r} is outside the agent's {kind} directories ({where})"

    @staticmethod
    def output_files(env: Mapping[str, str]) -> tuple[str, ...]:
        """The keys of ``env`` that name a file the job writes (those :meth:`confine` rewrites), sorted."""
        return tuple(sorted(key for key in env if isinstance(_value_type(key), OutputFile)))

    @staticmethod
    def confine(env: Mapping[str, str], job_dir: Path) -> dict[str, str]:
        """``env`` with every output-file variable rewritten into ``job_dir``'s output directory.

        Call it on an environment :meth:`check` accepted; a value that is not a bare file name (an
        environment from elsewhere) raises ``EnvPolicyError`` rather than reach outside the job.
        """
        out = dict(env)
        violations = []
        for key, value in env.items():
            if isinstance(_value_type(key), OutputFile):
                if not _FILE_NAME_RE.match(value):
                    violations.append(EnvViolation(key, "not a bare file name; refusing to write it"))
                    continue
                out[key] = str(job_dir / OUTPUT_DIR / value)
        EnvPolicy._raise(violations)
        return out


def _socket_product_reason(env: Mapping[str, str]) -> str | None:
    # Either one alone counts against the other's default of 1 (NCCL_FACTS §1.2: product <= 64).
    threads = env.get("NCCL_SOCKET_NTHREADS", "1")
    socks = env.get("NCCL_NSOCKS_PERTHREAD", "1")
    if not (DECIMAL.match(threads) and DECIMAL.match(socks)):
        return "NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD must both be decimal integers"
    if int(threads) * int(socks) > _SOCKET_THREAD_PRODUCT_MAX:
        return f"NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD must be <= {_SOCKET_THREAD_PRODUCT_MAX}"
    return None
