"""Which environment variables a benchmark job or a config version may set: an allow-list by name.

The agent runs privileged on every GPU node, so a benchmark's environment must not become a way to
run code, write files or hang the fabric there (architecture invariant 9). Every accepted name is
listed in :data:`VARIABLES` with the type of value it takes; a name not listed is refused with the
reason, so a variable a future NCCL adds (one that loads a library, say ``NCCL_IBVERBS_LIB``) is
refused until someone has read what it does and listed it.

Value types:

- :class:`Int` — a decimal integer in a range. Only ``-?[0-9]+`` without leading zeros: NCCL reads
  integers with ``strtoll(value, NULL, 0)`` (``src/misc/param.cc``), which takes ``010`` as 8, ``0x10``
  as 16 and ``12abc`` as 12; such spellings are refused so the value checked is the value NCCL uses.
- :class:`Choice` — one of a set of words (``NCCL_DEBUG``, ``NCCL_P2P_LEVEL``...), case-insensitive.
- :class:`Pattern` — a list syntax NCCL parses itself (HCA and interface lists, subsystems, algorithms).
- ``NCCL_PROTO`` — a protocol list that must keep LL128 out (an explicit list forces LL128 on,
  NCCL_FACTS §1.2).
- :class:`Plugin` — ``none`` or an absolute path inside the agent's plugin directories (a bare name
  makes NCCL search the library path).
- :class:`InputFile` — a file NCCL reads: an absolute path inside the agent's config directories;
  ``NCCL_GRAPH_FILE`` also needs expert mode (NCCL_FACTS §1.3: graph injection is for experiments).
- :class:`OutputFile` — a file NCCL or torch writes (debug log, topology/graph dump, flight-recorder
  dump): the job gives a bare file name and the agent rewrites it into the job's own directory
  (:meth:`EnvPolicy.confine`). A config version may not set one: it would make every job write a file.

Knobs that hang or corrupt data are left out of the allowed values (NCCL_FACTS §1.3): P2P/GDR levels
above ``LOC``/``NVL``, ``NCCL_GRAPH_STREAM_ORDERING=0``, ``NCCL_MULTI_RANK_GPU_ENABLE=1``, an infinite
``NCCL_IB_TIMEOUT``, and a socket thread product above 64. Site variables (IB HCA, GID index, traffic
class, socket interface...) are listed like the others. Loader, interpreter and placement variables are
refused with their own reason, so an attempt is obvious in the logs.

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

__all__ = [
    "OUTPUT_DIR",
    "VARIABLES",
    "Choice",
    "EnvPolicy",
    "EnvPolicyError",
    "EnvViolation",
    "InputFile",
    "Int",
    "OutputFile",
    "Pattern",
    "Plugin",
    "Proto",
]

OUTPUT_DIR = "out"
"""The job directory's subdirectory that :class:`OutputFile` variables are rewritten into."""

_KEY_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")
_DECIMAL_RE = re.compile(r"^-?(0|[1-9][0-9]*)$")
_FILE_NAME_RE = re.compile(r"^[A-Za-z0-9_%][A-Za-z0-9_.%-]{0,127}$")  # no '/', no leading '.': stays put
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


@dataclass(frozen=True, slots=True)
class Int:
    low: int
    high: int
    why: str = ""
    """Said when a value is out of range (e.g. which values hang)."""

    def reason(self, value: str) -> str | None:
        if not _DECIMAL_RE.match(value):
            return f"must be a decimal integer in {self.low}..{self.high}"
        if not self.low <= int(value) <= self.high:
            return f"{value} is outside {self.low}..{self.high}" + (f" ({self.why})" if self.why else "")
        return None


@dataclass(frozen=True, slots=True)
class Choice:
    words: frozenset[str]
    why: str = ""
    """Said when a value is refused (e.g. which values hang)."""

    def reason(self, value: str) -> str | None:
        if value.upper() in self.words:
            return None
        return f"must be one of {', '.join(sorted(self.words))}" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True, slots=True)
class Pattern:
    regex: re.Pattern[str]
    shape: str

    def reason(self, value: str) -> str | None:
        return None if self.regex.fullmatch(value) else f"must look like {self.shape}"


_PROTO_TOKENS = frozenset({"LL", "LL128", "SIMPLE"})
_COLL_FUNCS = frozenset({"BROADCAST", "REDUCE", "ALLGATHER", "REDUCESCATTER", "ALLREDUCE"})


@dataclass(frozen=True, slots=True)
class Proto:
    """``NCCL_PROTO``: 2.24+ syntax ``protos;func:protos;...``; every segment must keep LL128 out."""

    def reason(self, value: str) -> str | None:
        for segment in value.split(";"):
            func, colon, spec = segment.rpartition(":")
            if colon and func.strip().upper() not in _COLL_FUNCS:
                return f"unknown collective {func.strip()!r} in NCCL_PROTO"
            spec = spec.strip()
            if not spec:
                return "an empty NCCL_PROTO segment"
            excluded = spec.startswith("^")
            tokens = {t.strip().upper() for t in spec.removeprefix("^").split(",")}
            unknown = tokens - _PROTO_TOKENS
            if unknown:
                return f"unknown protocol(s) {sorted(unknown)}"
            if excluded and "LL128" not in tokens:
                return "an NCCL_PROTO exclusion list that keeps LL128 forces LL128 on, which can corrupt data"
            if not excluded and "LL128" in tokens:
                return "listing LL128 in NCCL_PROTO forces it on, bypassing NCCL's safety checks (data corruption)"
        return None


@dataclass(frozen=True, slots=True)
class Plugin:
    """``none``, or an absolute path inside the agent's plugin directories."""


@dataclass(frozen=True, slots=True)
class InputFile:
    """A file NCCL reads: an absolute path inside the agent's config directories."""

    expert: bool = False


@dataclass(frozen=True, slots=True)
class OutputFile:
    """A file NCCL or torch writes: a bare name, rewritten into the job's own directory."""


ValueType = Int | Choice | Pattern | Proto | Plugin | InputFile | OutputFile

_BOOL = Int(0, 1)
_CHANNELS = Int(1, 64)
_SIZE = Int(1, 1 << 30)
_NAME = r"[A-Za-z0-9_.-]{1,64}"
_HCA_LIST = Pattern(
    re.compile(rf"\^?=?{_NAME}(:[0-9]{{1,3}}){{0,3}}(,{_NAME}(:[0-9]{{1,3}}){{0,3}}){{0,63}}"),
    "[^][=]mlx5_0[:1],mlx5_1...",
)
_IF_LIST = Pattern(re.compile(r"\^?=?[A-Za-z0-9_.@-]{1,15}(,=?[A-Za-z0-9_.@-]{1,15}){0,63}"), "[^][=]eth0,ib0...")
_ALGO_WORDS = r"(?i:ring|tree|collnetchain|collnetdirect|nvls|nvlstree|pat)"
_ALGO_SPEC = rf"\^?{_ALGO_WORDS}(,{_ALGO_WORDS}){{0,7}}"
_ALGO_FUNC = r"(?i:broadcast|reduce|allgather|reducescatter|allreduce)"

VARIABLES: Mapping[str, ValueType] = {
    # --- searched by studies (NCCL_FACTS §1.3) ---------------------------------------------------------
    "NCCL_MIN_CTAS": _CHANNELS,
    "NCCL_MAX_CTAS": _CHANNELS,
    "NCCL_MIN_NCHANNELS": _CHANNELS,
    "NCCL_MAX_NCHANNELS": _CHANNELS,
    "NCCL_MIN_P2P_NCHANNELS": _CHANNELS,
    "NCCL_MAX_P2P_NCHANNELS": _CHANNELS,
    "NCCL_NVLS_NCHANNELS": _CHANNELS,
    "NCCL_NCHANNELS_PER_NET_PEER": _CHANNELS,
    "NCCL_NTHREADS": Choice(frozenset({"64", "128", "256", "512"})),
    "NCCL_LL128_NTHREADS": Int(64, 640),
    "NCCL_BUFFSIZE": _SIZE,
    "NCCL_LL_BUFFSIZE": _SIZE,
    "NCCL_LL128_BUFFSIZE": _SIZE,
    "NCCL_CHUNK_SIZE": Int(0, 1 << 30),
    "NCCL_P2P_NET_CHUNKSIZE": _SIZE,
    "NCCL_P2P_NVL_CHUNKSIZE": _SIZE,
    "NCCL_P2P_PCI_CHUNKSIZE": _SIZE,
    "NCCL_NVLS_CHUNKSIZE": _SIZE,
    "NCCL_IB_QPS_PER_CONNECTION": Int(1, 128),
    "NCCL_IB_SPLIT_DATA_ON_QPS": _BOOL,
    "NCCL_CROSS_NIC": Int(0, 2),
    "NCCL_SOCKET_NTHREADS": Int(1, 16),
    "NCCL_NSOCKS_PERTHREAD": Int(1, 64),
    "NCCL_NVLS_ENABLE": Int(0, 2),
    "NCCL_PXN_DISABLE": _BOOL,
    "NCCL_P2P_PXN_LEVEL": Int(0, 2),
    "NCCL_ALGO": Pattern(
        re.compile(rf"({_ALGO_FUNC}:)?{_ALGO_SPEC}(;{_ALGO_FUNC}:{_ALGO_SPEC}){{0,4}}"),
        "Ring,Tree or ^NVLS or allreduce:tree;broadcast:ring",
    ),
    "NCCL_PROTO": Proto(),
    "NCCL_CTA_POLICY": Choice(frozenset({"DEFAULT", "EFFICIENCY", "ZERO"})),
    "NCCL_NETDEVS_POLICY": Pattern(re.compile(r"(?i:auto|all|max:[1-9][0-9]?)"), "AUTO, ALL or MAX:N"),
    "NCCL_CUMEM_ENABLE": _BOOL,
    "NCCL_CUMEM_HOST_ENABLE": _BOOL,
    "NCCL_P2P_DISABLE": _BOOL,
    "NCCL_SHM_DISABLE": _BOOL,
    "NCCL_NET_GDR_READ": _BOOL,
    "NCCL_NET_GDR_C2C": _BOOL,
    # --- hang or corrupt data beyond these values (NCCL_FACTS §1.3) -------------------------------------
    "NCCL_P2P_LEVEL": Choice(
        frozenset({"LOC", "NVL", "0"}), "raising NCCL_P2P_LEVEL beyond NCCL's choice can hang or corrupt data"
    ),
    "NCCL_NET_GDR_LEVEL": Choice(
        frozenset({"LOC", "0"}), "raising NCCL_NET_GDR_LEVEL beyond NCCL's choice can hang or corrupt data"
    ),
    "NCCL_GRAPH_STREAM_ORDERING": Choice(
        frozenset({"1"}), "NCCL_GRAPH_STREAM_ORDERING=0 leaves kernel ordering to the application (hangs)"
    ),
    "NCCL_MULTI_RANK_GPU_ENABLE": Choice(frozenset({"0"}), "several ranks per GPU can hang (NCCL docs)"),
    "NCCL_IB_TIMEOUT": Int(1, 31, "0 or >= 32 waits forever"),
    # --- site settings, fixed once per fabric (NCCL_FACTS §1.3) -----------------------------------------
    "NCCL_IB_HCA": _HCA_LIST,
    "NCCL_IB_GID_INDEX": Int(-1, 255),
    "NCCL_IB_ADDR_FAMILY": Choice(frozenset({"AF_INET", "AF_INET6"})),
    "NCCL_IB_ADDR_RANGE": Pattern(re.compile(r"[0-9A-Fa-f:.]{2,39}/[0-9]{1,3}"), "10.0.0.0/8 (a CIDR range)"),
    "NCCL_IB_ROCE_VERSION_NUM": Int(1, 2),
    "NCCL_IB_TC": Int(0, 255),
    "NCCL_IB_SL": Int(0, 15),
    "NCCL_IB_FIFO_TC": Int(0, 255),
    "NCCL_IB_RETRY_CNT": Int(0, 7),
    "NCCL_IB_PCI_RELAXED_ORDERING": Int(0, 2),
    "NCCL_IB_ADAPTIVE_ROUTING": _BOOL,
    "NCCL_IB_AR_THRESHOLD": Int(0, 1 << 30),
    "NCCL_IB_ECE_ENABLE": _BOOL,
    "NCCL_IB_MERGE_NICS": _BOOL,
    "NCCL_IB_MERGE_VFS": _BOOL,
    "NCCL_IB_DISABLE": _BOOL,
    "NCCL_SOCKET_IFNAME": _IF_LIST,
    "NCCL_SOCKET_FAMILY": Choice(frozenset({"AF_INET", "AF_INET6"})),
    "NCCL_NET": Pattern(re.compile(r"[A-Za-z0-9_ -]{1,32}"), "IB or Socket (a network plugin's name)"),
    "NCCL_IGNORE_CPU_AFFINITY": _BOOL,
    "NCCL_HOSTID": Pattern(re.compile(_NAME), "a host name (letters, digits, '.', '_', '-')"),
    "NCCL_TOPO_FILE": InputFile(),
    "NCCL_GRAPH_FILE": InputFile(expert=True),
    "NCCL_CONF_FILE": InputFile(),
    "NCCL_TUNER_CONFIG_FILE": InputFile(),
    "NCCL_TUNER_PLUGIN": Plugin(),
    "NCCL_NET_PLUGIN": Plugin(),
    "NCCL_PROFILER_PLUGIN": Plugin(),
    "NCCL_ENV_PLUGIN": Plugin(),
    # --- debugging --------------------------------------------------------------------------------------
    "NCCL_DEBUG": Choice(frozenset({"VERSION", "WARN", "INFO", "ABORT", "TRACE", "NONE"})),
    "NCCL_DEBUG_SUBSYS": Pattern(re.compile(r"\^?[A-Za-z]{1,16}(,[A-Za-z]{1,16}){0,31}"), "INIT,GRAPH or ^ALL"),
    "NCCL_DEBUG_FILE": OutputFile(),
    "NCCL_TOPO_DUMP_FILE": OutputFile(),
    "NCCL_TOPO_DUMP_FILE_RANK": Int(0, 1 << 20),
    "NCCL_GRAPH_DUMP_FILE": OutputFile(),
    "NCCL_GRAPH_DUMP_FILE_RANK": Int(0, 1 << 20),
    # --- PyTorch's NCCL and flight-recorder knobs (torch_nccl_environment_variables) --------------------
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": Int(0, 3),
    "TORCH_NCCL_BLOCKING_WAIT": _BOOL,
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": Int(1, 86400),
    "TORCH_NCCL_ENABLE_MONITORING": _BOOL,
    "TORCH_NCCL_DUMP_ON_TIMEOUT": _BOOL,
    "TORCH_NCCL_DESYNC_DEBUG": _BOOL,
    "TORCH_NCCL_TRACE_BUFFER_SIZE": Int(0, 1 << 16),
    "TORCH_FR_BUFFER_SIZE": Int(0, 1 << 16),
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": OutputFile(),
    "TORCH_FR_DUMP_TEMP_FILE": OutputFile(),
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": OutputFile(),
    "TORCH_DISTRIBUTED_DEBUG": Choice(frozenset({"OFF", "INFO", "DETAIL"})),
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": _BOOL,
    "NVSHMEM_DISABLE_NVLS": _BOOL,
}
"""Every variable a job or a config version may set, with the values it may take."""

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
            if violation is None and isinstance(VARIABLES.get(key), OutputFile):
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
        kind = VARIABLES.get(key)
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
    def confine(env: Mapping[str, str], job_dir: Path) -> dict[str, str]:
        """``env`` with every output-file variable rewritten into ``job_dir``'s output directory.

        Call it on an environment :meth:`check` accepted; a value that is not a bare file name (an
        environment from elsewhere) raises ``EnvPolicyError`` rather than reach outside the job.
        """
        out = dict(env)
        violations = []
        for key, value in env.items():
            if isinstance(VARIABLES.get(key), OutputFile):
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
    if not (_DECIMAL_RE.match(threads) and _DECIMAL_RE.match(socks)):
        return "NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD must both be decimal integers"
    if int(threads) * int(socks) > _SOCKET_THREAD_PRODUCT_MAX:
        return f"NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD must be <= {_SOCKET_THREAD_PRODUCT_MAX}"
    return None
