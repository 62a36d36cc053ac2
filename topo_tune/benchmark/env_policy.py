"""Which environment variables a benchmark job may hand to the agent's worker processes.

The agent runs privileged on every GPU node, so a benchmark's environment must not become a way
to run code there (architecture invariant 9). The policy is an allow-list:

- ``NCCL_*`` variables, minus the ones below;
- ``TORCH_NCCL_*`` (PyTorch's NCCL watchdog and error-handling knobs) and
  ``TORCH_DISTRIBUTED_DEBUG``;
- ``TORCH_SYMM_MEM_DISABLE_MULTICAST`` and ``NVSHMEM_DISABLE_NVLS`` (they only switch NVLink
  multicast off, which shared hosts require).

Everything else is refused, with a reason per class:

- loader and interpreter variables (``LD_*``, ``PATH``, ``PYTHON*``, ``BASH_ENV``...): they
  load or run code;
- ``CUDA_VISIBLE_DEVICES`` and friends: GPU placement comes from the job's rank map;
- plugin variables (``NCCL_*_PLUGIN``): ``none`` or an absolute path inside the agent's plugin
  directories only (a bare name makes NCCL search the library path);
- file variables (``NCCL_TOPO_FILE``, ``NCCL_CONF_FILE``, ``NCCL_*_DUMP_FILE``...): absolute
  paths inside the agent's own config directories only; ``NCCL_GRAPH_FILE`` additionally
  needs expert mode (NCCL_FACTS §1.3: graph injection is for experiments);
- knobs that can corrupt data or hang (NCCL_FACTS §1.3): an ``NCCL_PROTO`` that does not
  exclude LL128 (it forces LL128 on), ``NCCL_P2P_LEVEL``/``NCCL_NET_GDR_LEVEL`` above ``LOC``
  /``NVL`` (they can raise the level beyond NCCL's own choice), ``NCCL_GRAPH_STREAM_ORDERING=0``,
  ``NCCL_MULTI_RANK_GPU_ENABLE`` on, an infinite ``NCCL_IB_TIMEOUT``, ``NCCL_COMM_ID`` (the job's
  rendezvous is the agent's business), and a socket thread product above 64.

Non-goals: choosing values (the tuner's search space) or checking that values are the same on
every rank (the controller sends one environment to all ranks).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EnvPolicy", "EnvPolicyError", "EnvViolation"]

_KEY_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")
_MAX_VALUE_LEN = 1023  # NCCL truncates keys and values at 1023 characters

_ALLOWED_EXACT = frozenset({"TORCH_DISTRIBUTED_DEBUG", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"})
_ALLOWED_PREFIXES = ("NCCL_", "TORCH_NCCL_")

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

# NCCL variables whose value is a file NCCL reads or writes.
_FILE_KEYS = frozenset(
    {
        "NCCL_TOPO_FILE",
        "NCCL_TOPO_DUMP_FILE",
        "NCCL_GRAPH_FILE",
        "NCCL_GRAPH_DUMP_FILE",
        "NCCL_CONF_FILE",
        "NCCL_TUNER_CONFIG_FILE",
        "NCCL_DEBUG_FILE",
        "NCCL_RAS_ADDR_FILE",
    }
)
_PLUGIN_RE = re.compile(r"^NCCL_[A-Z0-9_]*_PLUGIN$")
_PROTO_TOKENS = frozenset({"LL", "LL128", "SIMPLE"})
_SAFE_P2P_LEVELS = frozenset({"LOC", "NVL", "0"})
_SAFE_GDR_LEVELS = frozenset({"LOC", "0"})
_IB_TIMEOUT_MAX = 31  # 0 or >= 32 means "wait forever"
_SOCKET_THREAD_PRODUCT_MAX = 64


@dataclass(frozen=True, slots=True)
class EnvViolation:
    key: str
    reason: str

    def __str__(self) -> str:
        return f"{self.key}: {self.reason}"


class EnvPolicyError(ValueError):
    """The environment was refused; ``violations`` lists every refused key with its reason."""

    def __init__(self, violations: Iterable[EnvViolation]) -> None:
        self.violations = tuple(violations)
        super().__init__("benchmark env refused: " + "; ".join(str(v) for v in self.violations))


def _proto_violation(value: str) -> str | None:
    # 2.24+ syntax: "protos;func:protos;..." -- every segment must keep LL128 out.
    for segment in value.split(";"):
        spec = segment.split(":", 1)[1] if ":" in segment else segment
        spec = spec.strip()
        if not spec:
            continue
        excluded = spec.startswith("^")
        tokens = {t.strip().upper() for t in spec.lstrip("^").split(",") if t.strip()}
        unknown = tokens - _PROTO_TOKENS
        if unknown:
            return f"unknown protocol(s) {sorted(unknown)}"
        if excluded and "LL128" not in tokens:
            return "an NCCL_PROTO exclusion list that keeps LL128 forces LL128 on, which can corrupt data"
        if not excluded and "LL128" in tokens:
            return "listing LL128 in NCCL_PROTO forces it on, bypassing NCCL's safety checks (data corruption)"
    return None


def _int_or_none(value: str) -> int | None:
    try:
        return int(value.strip(), 0)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class EnvPolicy:
    """The agent's policy; its directories come from the agent's own configuration."""

    config_dirs: tuple[Path, ...] = ()
    """Directories whose files ``NCCL_*_FILE`` variables may name (e.g. the agent's config dir)."""
    plugin_dirs: tuple[Path, ...] = ()
    """Directories whose shared objects ``NCCL_*_PLUGIN`` variables may name."""
    expert_mode: bool = False
    """Allow ``NCCL_GRAPH_FILE`` (inside ``config_dirs``)."""

    def check(self, env: Mapping[str, str]) -> None:
        """Raise ``EnvPolicyError`` listing every refused key; return quietly if all are allowed."""
        violations = [v for key in sorted(env) if (v := self.violation(key, env[key], env)) is not None]
        if violations:
            raise EnvPolicyError(violations)

    def violation(self, key: str, value: str, env: Mapping[str, str]) -> EnvViolation | None:
        reason = self._reason(key, value, env)
        return None if reason is None else EnvViolation(key, reason)

    def _reason(self, key: str, value: str, env: Mapping[str, str]) -> str | None:
        if not _KEY_RE.match(key):
            return "not a valid variable name (upper-case letters, digits and '_')"
        if any(ord(c) < 0x20 or c == "\x7f" for c in value):
            return "the value contains control characters"
        if len(value) > _MAX_VALUE_LEN:
            return f"the value is longer than {_MAX_VALUE_LEN} characters"
        if key in _LOADER_INTERPRETER_EXACT or key.startswith(_LOADER_INTERPRETER_PREFIXES):
            return "loader/interpreter variables are never accepted (they load or run code)"
        if key in _PLACEMENT_KEYS:
            return "GPU placement comes from the job's rank map, not from the environment"
        if not (key in _ALLOWED_EXACT or key.startswith(_ALLOWED_PREFIXES)):
            return "not allow-listed (accepted: NCCL_*, TORCH_NCCL_*, " + ", ".join(sorted(_ALLOWED_EXACT)) + ")"
        return self._nccl_reason(key, value, env)

    def _nccl_reason(self, key: str, value: str, env: Mapping[str, str]) -> str | None:
        if _PLUGIN_RE.match(key):
            if value.strip().lower() in ("", "none"):
                return None
            return self._path_reason(value, self.plugin_dirs, "plugin")
        if key in _FILE_KEYS:
            if key == "NCCL_GRAPH_FILE" and not self.expert_mode:
                return "NCCL_GRAPH_FILE is for experiments only and needs the agent's expert mode"
            return self._path_reason(value, self.config_dirs, "config")
        if key == "NCCL_COMM_ID":
            return "the rendezvous is chosen by the agent from the job, not from the environment"
        if key == "NCCL_PROTO":
            return _proto_violation(value)
        if key == "NCCL_P2P_LEVEL" and value.strip().upper() not in _SAFE_P2P_LEVELS:
            return "raising NCCL_P2P_LEVEL beyond NCCL's choice can hang or corrupt data; only LOC or NVL"
        if key == "NCCL_NET_GDR_LEVEL" and value.strip().upper() not in _SAFE_GDR_LEVELS:
            return "raising NCCL_NET_GDR_LEVEL beyond NCCL's choice can hang or corrupt data; only LOC"
        if key == "NCCL_GRAPH_STREAM_ORDERING" and value.strip() == "0":
            return "NCCL_GRAPH_STREAM_ORDERING=0 leaves kernel ordering to the application (hangs)"
        if key == "NCCL_MULTI_RANK_GPU_ENABLE" and value.strip() not in ("", "0"):
            return "several ranks per GPU can hang (NCCL docs)"
        if key == "NCCL_IB_TIMEOUT":
            timeout = _int_or_none(value)
            if timeout is None or timeout <= 0 or timeout > _IB_TIMEOUT_MAX:
                return f"NCCL_IB_TIMEOUT must be 1..{_IB_TIMEOUT_MAX}; 0 or >= 32 waits forever"
        if key in ("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"):
            threads = _int_or_none(env.get("NCCL_SOCKET_NTHREADS", "1"))
            socks = _int_or_none(env.get("NCCL_NSOCKS_PERTHREAD", "1"))
            if threads is None or socks is None or threads < 1 or socks < 1:
                return "must be a positive integer"
            if threads * socks > _SOCKET_THREAD_PRODUCT_MAX:
                return f"NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD must be <= {_SOCKET_THREAD_PRODUCT_MAX}"
        return None

    def _path_reason(self, value: str, roots: tuple[Path, ...], kind: str) -> str | None:
        if not os.path.isabs(value):
            return f"must be an absolute path inside the agent's {kind} directories"
        # realpath resolves symlinks and '..' so a link inside the directory cannot point out.
        target = Path(os.path.realpath(value))
        for root in roots:
            real_root = Path(os.path.realpath(root))
            if target == real_root or real_root in target.parents:
                return None
        where = ", ".join(str(r) for r in roots) or "none configured"
        return f"{value!r} is outside the agent's {kind} directories ({where})"
