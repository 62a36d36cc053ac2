"""Every environment variable topo-tune knows, once: value type, role, whether the simulator models it, why.

Adding a knob means adding one :class:`Variable` here (and, for a searched one, its :class:`CatalogueDimension`);
the environment policy (what a job or config version may set), the search space (what a study may change,
to which values), the site-fixed keys (what ``siteFixed`` may hold), the simulator's knob table and the
docs' table (``docs/nccl-variables.md``, generated) all derive from :data:`CATALOGUE`, and
``tests/test_knob_catalogue.py`` fails when one of them names a variable this table does not, or disagrees.

Roles (NCCL_FACTS §1.3):

- ``searched`` — performance only, given identical values on every rank: a dimension of the search space.
- ``tunable`` — performance only; a job or config version may set it, studies leave it to NCCL.
- ``site`` — fixed once per fabric (HCAs, GID, QoS, interfaces): ``siteFixed`` passes it unchanged into
  every trial and output; never searched.
- ``forbidden`` — never searched: beyond NCCL's own choice it hangs, corrupts data or fails jobs; the
  policy accepts only the values listed as safe.
- ``managed`` — set by topo-tune itself from a job's config version (``nccl.conf``, the tuner plugin).
- ``debug`` — logging, dumps and PyTorch's watchdog/flight-recorder switches.

Non-goals: checking values against the agent's directories (``benchmark/env_policy.py``), the refused
loader/interpreter names (the policy refuses every name that is not here, with its reason).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from topo_tune.nccl.backends import Backend
from topo_tune.nccl.value_types import Choice, InputFile, Int, OutputFile, Pattern, Plugin, Proto, ValueType

__all__ = ["CATALOGUE", "Catalogue", "CatalogueDimension", "Need", "Variable", "VariableRole"]


class VariableRole(enum.Enum):
    SEARCHED = "searched"
    TUNABLE = "tunable"
    SITE = "site"
    FORBIDDEN = "forbidden"
    MANAGED = "managed"
    DEBUG = "debug"


class Need(enum.Enum):
    """What a fabric or workload must have for a dimension to mean anything there."""

    MULTI_NODE = "multi_node"
    IB = "ib"
    SOCKET = "socket"
    IB_OR_SOCKET = "ib_or_socket"
    NVLS = "nvls"
    P2P_COLLECTIVES = "p2p_collectives"
    """The workload runs alltoall or send/recv."""
    CROSS_NIC_VALUES = "cross_nic_values"
    """Only the values the fabric tolerates (``Fabric.cross_nic_values``; unset is 2)."""


Version = tuple[int, int, int]


@dataclass(frozen=True)
class CatalogueDimension:
    """One searched dimension: the variables it sets and its values, in scale order (``None``: unset).

    A value is one integer per variable (``(24, 24)`` for ``NCCL_MIN_CTAS=NCCL_MAX_CTAS=24``). Its name is
    the first integer (``"24"``) or, with ``names="x"``, all of them (``"4x1"``).
    """

    name: str
    variables: tuple[str, ...]
    values: tuple[tuple[int, ...] | None, ...]
    ordered: bool
    reason: str
    since: Version = (0, 0, 0)
    needs: frozenset[Need] = frozenset()
    cap: tuple[Version, int] | None = None
    """``(version, limit)``: before ``version`` no value above ``limit`` exists (channels: 32 before 2.25)."""
    names: Literal["first", "x"] = "first"

    def value_name(self, value: tuple[int, ...] | None) -> str | None:
        if value is None:
            return None
        return "x".join(str(v) for v in value) if self.names == "x" else str(value[0])


@dataclass(frozen=True)
class Variable:
    name: str
    type: ValueType
    role: VariableRole
    why: str
    sim: bool = False
    """The ``sim`` backend models its effect (everything else passes through it unchanged)."""
    hazard: str = ""
    """What goes wrong when a study searches it: such a knob is refused by name with this reason."""

    @property
    def backends(self) -> tuple[Backend, ...]:
        """The benchmark backends whose measurements it changes (gloo runs no NCCL: none of them)."""
        return tuple(b for b in Backend if b.runs_nccl or (self.sim and b.simulated))


@dataclass(frozen=True)
class Catalogue:
    variables: tuple[Variable, ...]
    dimensions: tuple[CatalogueDimension, ...]
    _by_name: Mapping[str, Variable] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name = {v.name: v for v in self.variables}
        if len(by_name) != len(self.variables):
            raise ValueError("a variable is listed twice in the catalogue")
        object.__setattr__(self, "_by_name", MappingProxyType(by_name))
        for dim in self.dimensions:
            for name in dim.variables:
                if name not in by_name or by_name[name].role is not VariableRole.SEARCHED:
                    raise ValueError(f"dimension {dim.name} sets {name}, which is not a searched variable")
        searched = {n for d in self.dimensions for n in d.variables}
        for var in self.variables:
            if var.role is VariableRole.SEARCHED and var.name not in searched:
                raise ValueError(f"{var.name} is searched but no dimension sets it")
            if var.role is VariableRole.FORBIDDEN and not var.hazard:
                raise ValueError(f"{var.name} is forbidden without saying why (hazard)")

    def __iter__(self) -> Iterator[Variable]:
        return iter(self.variables)

    def get(self, name: str) -> Variable | None:
        return self._by_name.get(name)

    def with_role(self, *roles: VariableRole) -> tuple[Variable, ...]:
        return tuple(v for v in self.variables if v.role in roles)

    def names(self, *roles: VariableRole) -> frozenset[str]:
        return frozenset(v.name for v in self.with_role(*roles))

    @property
    def value_types(self) -> Mapping[str, ValueType]:
        """Every variable a job or a config version may set, with the values it may take."""
        return MappingProxyType({v.name: v.type for v in self.variables})

    @property
    def never_searched(self) -> Mapping[str, str]:
        """Knobs a study refuses by name, with the reason a user asking for one is told."""
        return MappingProxyType({v.name: v.hazard for v in self.variables if v.hazard})

    @property
    def site(self) -> frozenset[str]:
        """What ``siteFixed`` may hold."""
        return self.names(VariableRole.SITE)

    @property
    def simulated(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.variables if v.sim)

    def extended(self, variables: Iterable[Variable], dimensions: Iterable[CatalogueDimension] = ()) -> Catalogue:
        """This catalogue with more entries (how a new knob is tried out before it is listed here)."""
        return Catalogue((*self.variables, *variables), (*self.dimensions, *dimensions))


_MIB = 1 << 20
_KIB = 1 << 10
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
_FAMILY = Choice(frozenset({"AF_INET", "AF_INET6"}))
_DEPRECATED_CHANNELS = "deprecated since 2.17; the space searches channels through NCCL_MIN_CTAS/NCCL_MAX_CTAS"

_S, _T, _SITE, _F, _M, _D = (
    VariableRole.SEARCHED,
    VariableRole.TUNABLE,
    VariableRole.SITE,
    VariableRole.FORBIDDEN,
    VariableRole.MANAGED,
    VariableRole.DEBUG,
)

_VARIABLES = (
    # --- performance: searched by studies, or left to NCCL -----------------------------------------------
    Variable("NCCL_MIN_CTAS", _CHANNELS, _S, "lower bound of the channel (CTA) count", sim=True),
    Variable("NCCL_MAX_CTAS", _CHANNELS, _S, "upper bound of the channel (CTA) count", sim=True),
    Variable(
        "NCCL_MIN_NCHANNELS", _CHANNELS, _T, "the channel bound before 2.17", sim=True, hazard=_DEPRECATED_CHANNELS
    ),
    Variable(
        "NCCL_MAX_NCHANNELS", _CHANNELS, _T, "the channel bound before 2.17", sim=True, hazard=_DEPRECATED_CHANNELS
    ),
    Variable("NCCL_MIN_P2P_NCHANNELS", _CHANNELS, _T, "channels of send/recv operations"),
    Variable("NCCL_MAX_P2P_NCHANNELS", _CHANNELS, _T, "channels of send/recv operations"),
    Variable("NCCL_NVLS_NCHANNELS", _CHANNELS, _T, "channels of NVLink SHARP collectives"),
    Variable("NCCL_NCHANNELS_PER_NET_PEER", _CHANNELS, _S, "channels per network peer (alltoall, send/recv)", sim=True),
    Variable("NCCL_NTHREADS", Choice(frozenset({"64", "128", "256", "512"})), _S, "threads per CTA", sim=True),
    Variable("NCCL_LL128_NTHREADS", Int(64, 640), _T, "threads per CTA of the LL128 protocol"),
    Variable("NCCL_BUFFSIZE", _SIZE, _S, "per-peer, per-channel buffer of the Simple protocol", sim=True),
    Variable("NCCL_LL_BUFFSIZE", _SIZE, _T, "per-peer, per-channel buffer of the LL protocol"),
    Variable(
        "NCCL_LL128_BUFFSIZE",
        _SIZE,
        _T,
        "per-peer, per-channel buffer of the LL128 protocol",
        hazard="LL128 internals; only reachable where LL128 runs, which NCCL alone may decide",
    ),
    Variable("NCCL_CHUNK_SIZE", Int(0, 1 << 30), _T, "chunk size of tree algorithms"),
    Variable("NCCL_P2P_NET_CHUNKSIZE", _SIZE, _S, "network chunk size of send/recv and alltoall", sim=True),
    Variable("NCCL_P2P_NVL_CHUNKSIZE", _SIZE, _T, "NVLink chunk size of send/recv", sim=True),
    Variable("NCCL_P2P_PCI_CHUNKSIZE", _SIZE, _T, "PCI chunk size of send/recv"),
    Variable("NCCL_NVLS_CHUNKSIZE", _SIZE, _T, "chunk size of NVLink SHARP collectives"),
    Variable("NCCL_IB_QPS_PER_CONNECTION", Int(1, 128), _S, "more QPs spread flows over ECMP paths", sim=True),
    Variable("NCCL_IB_SPLIT_DATA_ON_QPS", _BOOL, _S, "round-robin or split data over the QPs", sim=True),
    Variable("NCCL_CROSS_NIC", Int(0, 2), _S, "whether rings may change NICs (rail affinity)", sim=True),
    Variable("NCCL_SOCKET_NTHREADS", Int(1, 16), _S, "socket transport threads (product with sockets <= 64)", sim=True),
    Variable("NCCL_NSOCKS_PERTHREAD", Int(1, 64), _S, "sockets per socket-transport thread", sim=True),
    Variable("NCCL_NVLS_ENABLE", Int(0, 2), _S, "NVLink SHARP on (default) or off", sim=True),
    Variable("NCCL_PXN_DISABLE", _BOOL, _S, "send through a peer GPU's NIC (PXN) or not", sim=True),
    Variable("NCCL_P2P_PXN_LEVEL", Int(0, 2), _T, "when send/recv goes through PXN"),
    Variable(
        "NCCL_ALGO",
        Pattern(
            re.compile(rf"({_ALGO_FUNC}:)?{_ALGO_SPEC}(;{_ALGO_FUNC}:{_ALGO_SPEC}){{0,4}}"),
            "Ring,Tree or ^NVLS or allreduce:tree;broadcast:ring",
        ),
        _T,
        "the algorithms NCCL may choose from",
        sim=True,
        hazard=(
            "forcing an algorithm fails or hangs collectives that lack it (NVLSTree reduce_scatter hung, NVIDIA/nccl "
            "issue #1110); algorithms are chosen per size through the tuner plugin, which only picks allowed ones"
        ),
    ),
    Variable(
        "NCCL_PROTO",
        Proto(),
        _T,
        "the protocols NCCL may choose from (LL128 must stay out of an explicit list)",
        sim=True,
        hazard=(
            "any NCCL_PROTO list that does not exclude LL128 forces LL128 on, bypassing NCCL's safety gate, and "
            "can corrupt data silently (NCCL env.rst, src/graph/tuning.cc); protocols are chosen per size "
            "through the tuner plugin"
        ),
    ),
    Variable("NCCL_CTA_POLICY", Choice(frozenset({"DEFAULT", "EFFICIENCY", "ZERO"})), _T, "how many CTAs NCCL uses"),
    Variable(
        "NCCL_NETDEVS_POLICY",
        Pattern(re.compile(r"(?i:auto|all|max:[1-9][0-9]?)"), "AUTO, ALL or MAX:N"),
        _T,
        "how many NICs a GPU uses",
    ),
    Variable("NCCL_CUMEM_HOST_ENABLE", _BOOL, _T, "cuMem host allocations"),
    Variable("NCCL_P2P_DISABLE", _BOOL, _T, "turn off direct GPU-to-GPU transport (slower, never unsafe)"),
    Variable("NCCL_SHM_DISABLE", _BOOL, _T, "turn off shared-memory transport (slower, never unsafe)"),
    Variable("NCCL_NET_GDR_READ", _BOOL, _T, "GPU Direct RDMA for sends"),
    Variable("NCCL_NET_GDR_C2C", _BOOL, _T, "GPU Direct RDMA over C2C (Grace)"),
    # --- hang or corrupt data beyond the listed values -----------------------------------------------------
    Variable(
        "NCCL_P2P_LEVEL",
        Choice(frozenset({"LOC", "NVL", "0"}), "raising NCCL_P2P_LEVEL beyond NCCL's choice can hang or corrupt data"),
        _F,
        "may only lower NCCL's choice of peer-to-peer paths",
        hazard="raising P2P beyond NCCL's choice (e.g. across root complexes, ACS on) can hang or corrupt",
    ),
    Variable(
        "NCCL_NET_GDR_LEVEL",
        Choice(frozenset({"LOC", "0"}), "raising NCCL_NET_GDR_LEVEL beyond NCCL's choice can hang or corrupt data"),
        _F,
        "may only lower NCCL's choice of GPU Direct RDMA paths",
        hazard="GPU Direct RDMA over longer paths than NCCL chose can be slower or broken",
    ),
    Variable(
        "NCCL_GRAPH_STREAM_ORDERING",
        Choice(frozenset({"1"}), "NCCL_GRAPH_STREAM_ORDERING=0 leaves kernel ordering to the application (hangs)"),
        _F,
        "NCCL orders its kernels in CUDA graphs",
        hazard="with 0 the application must serialize NCCL kernels itself, or it hangs",
    ),
    Variable(
        "NCCL_MULTI_RANK_GPU_ENABLE",
        Choice(frozenset({"0"}), "several ranks per GPU can hang (NCCL docs)"),
        _F,
        "one rank per GPU",
        hazard="NCCL's documentation warns of hangs",
    ),
    Variable(
        "NCCL_GRAPH_FILE",
        InputFile(expert=True),
        _F,
        "injects NCCL's channel graphs (experiments, expert mode only)",
        hazard="a graph file fixes channels per node type; other GPU sets fail ('dev not found', #1008)",
    ),
    # --- site settings, fixed once per fabric ---------------------------------------------------------------
    Variable("NCCL_IB_HCA", _HCA_LIST, _SITE, "which InfiniBand/RoCE devices and ports to use"),
    Variable("NCCL_IB_GID_INDEX", Int(-1, 255), _SITE, "RoCE GID index"),
    Variable("NCCL_IB_ADDR_FAMILY", _FAMILY, _SITE, "RoCE address family"),
    Variable(
        "NCCL_IB_ADDR_RANGE",
        Pattern(re.compile(r"[0-9A-Fa-f:.]{2,39}/[0-9]{1,3}"), "10.0.0.0/8 (a CIDR range)"),
        _SITE,
        "RoCE address range",
    ),
    Variable("NCCL_IB_ROCE_VERSION_NUM", Int(1, 2), _SITE, "RoCE version"),
    Variable("NCCL_IB_TC", Int(0, 255), _SITE, "traffic class (QoS)"),
    Variable("NCCL_IB_SL", Int(0, 15), _SITE, "service level (QoS)"),
    Variable("NCCL_IB_FIFO_TC", Int(0, 255), _SITE, "traffic class of control messages (QoS)"),
    Variable(
        "NCCL_IB_TIMEOUT",
        Int(1, 31, "0 or >= 32 waits forever"),
        _SITE,
        "InfiniBand verbs timeout",
        hazard="0 (or 32 and above) means an infinite timeout, i.e. hangs; too small gives spurious errors",
    ),
    Variable(
        "NCCL_IB_RETRY_CNT",
        Int(0, 7),
        _SITE,
        "InfiniBand verbs retry count",
        hazard="a fabric setting; wrong values turn transient errors into failures or hangs",
    ),
    Variable("NCCL_IB_PCI_RELAXED_ORDERING", Int(0, 2), _SITE, "PCI relaxed ordering of IB traffic"),
    Variable("NCCL_IB_ADAPTIVE_ROUTING", _BOOL, _SITE, "the fabric's adaptive routing"),
    Variable("NCCL_IB_AR_THRESHOLD", Int(0, 1 << 30), _SITE, "message size from which adaptive routing is used"),
    Variable("NCCL_IB_ECE_ENABLE", _BOOL, _SITE, "enhanced connection establishment"),
    Variable("NCCL_IB_MERGE_NICS", _BOOL, _SITE, "merge the ports of a dual-port NIC"),
    Variable("NCCL_IB_MERGE_VFS", _BOOL, _SITE, "merge virtual functions of one NIC"),
    Variable("NCCL_IB_DISABLE", _BOOL, _SITE, "use sockets instead of InfiniBand"),
    Variable("NCCL_SOCKET_IFNAME", _IF_LIST, _SITE, "which network interfaces to use"),
    Variable("NCCL_SOCKET_FAMILY", _FAMILY, _SITE, "socket address family"),
    Variable(
        "NCCL_NET",
        Pattern(re.compile(r"[A-Za-z0-9_ -]{1,32}"), "IB or Socket (a network plugin's name)"),
        _SITE,
        "which network transport",
    ),
    Variable("NCCL_IGNORE_CPU_AFFINITY", _BOOL, _SITE, "ignore the job's CPU affinity when placing threads"),
    Variable(
        "NCCL_HOSTID",
        Pattern(re.compile(_NAME), "a host name (letters, digits, '.', '_', '-')"),
        _SITE,
        "host identity",
    ),
    Variable("NCCL_TOPO_FILE", InputFile(), _SITE, "a topology file for machines NCCL cannot see (VMs)"),
    Variable("NCCL_NET_PLUGIN", Plugin(), _SITE, "a network plugin (e.g. the provider's)"),
    Variable("NCCL_CUMEM_ENABLE", _BOOL, _SITE, "cuMem device allocations (some drivers need it off)"),
    Variable("NCCL_PROFILER_PLUGIN", Plugin(), _T, "a profiler plugin"),
    Variable("NCCL_ENV_PLUGIN", Plugin(), _T, "an environment plugin"),
    # --- set by topo-tune from the job's config version -----------------------------------------------------
    Variable("NCCL_CONF_FILE", InputFile(), _M, "the config version's nccl.conf"),
    Variable("NCCL_TUNER_CONFIG_FILE", InputFile(), _M, "the config version's tuner-plugin table"),
    Variable("NCCL_TUNER_PLUGIN", Plugin(), _M, "topo-tune's tuner plugin"),
    # --- debugging ------------------------------------------------------------------------------------------
    Variable(
        "NCCL_DEBUG", Choice(frozenset({"VERSION", "WARN", "INFO", "ABORT", "TRACE", "NONE"})), _SITE, "log level"
    ),
    Variable(
        "NCCL_DEBUG_SUBSYS",
        Pattern(re.compile(r"\^?[A-Za-z]{1,16}(,[A-Za-z]{1,16}){0,31}"), "INIT,GRAPH or ^ALL"),
        _SITE,
        "which subsystems log",
    ),
    Variable("NCCL_DEBUG_FILE", OutputFile(), _D, "NCCL's log file"),
    Variable("NCCL_TOPO_DUMP_FILE", OutputFile(), _D, "a dump of the topology NCCL detected"),
    Variable("NCCL_TOPO_DUMP_FILE_RANK", Int(0, 1 << 20), _D, "the rank that dumps it"),
    Variable("NCCL_GRAPH_DUMP_FILE", OutputFile(), _D, "a dump of NCCL's channel graphs"),
    Variable("NCCL_GRAPH_DUMP_FILE_RANK", Int(0, 1 << 20), _D, "the rank that dumps them"),
    # --- PyTorch's NCCL and flight-recorder knobs (torch_nccl_environment_variables) -----------------------
    Variable("TORCH_NCCL_ASYNC_ERROR_HANDLING", Int(0, 3), _D, "how torch reacts to NCCL errors"),
    Variable("TORCH_NCCL_BLOCKING_WAIT", _BOOL, _D, "blocking waits on collectives"),
    Variable("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", Int(1, 86400), _D, "the watchdog's heartbeat timeout"),
    Variable("TORCH_NCCL_ENABLE_MONITORING", _BOOL, _D, "the watchdog's monitoring thread"),
    Variable("TORCH_NCCL_DUMP_ON_TIMEOUT", _BOOL, _D, "a flight-recorder dump on timeout"),
    Variable("TORCH_NCCL_DESYNC_DEBUG", _BOOL, _D, "desync diagnostics"),
    Variable("TORCH_NCCL_TRACE_BUFFER_SIZE", Int(0, 1 << 16), _D, "flight-recorder entries (older name)"),
    Variable("TORCH_FR_BUFFER_SIZE", Int(0, 1 << 16), _D, "flight-recorder entries"),
    Variable("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", OutputFile(), _D, "flight-recorder dump file (older name)"),
    Variable("TORCH_FR_DUMP_TEMP_FILE", OutputFile(), _D, "flight-recorder dump file"),
    Variable("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", OutputFile(), _D, "a pipe that triggers a dump"),
    Variable("TORCH_DISTRIBUTED_DEBUG", Choice(frozenset({"OFF", "INFO", "DETAIL"})), _D, "torch.distributed checks"),
    Variable("TORCH_SYMM_MEM_DISABLE_MULTICAST", _BOOL, _T, "NVLink multicast off for symmetric memory (VMs)"),
    Variable("NVSHMEM_DISABLE_NVLS", _BOOL, _T, "NVLink SHARP off for NVSHMEM (VMs)"),
)

_MULTI_IB = frozenset({Need.MULTI_NODE, Need.IB})
_MULTI_P2P = frozenset({Need.MULTI_NODE, Need.P2P_COLLECTIVES})

_DIMENSIONS = (
    # Unset sits where NCCL's own choice usually lands on this scale (nccl-tests on 2xH200 over NVLink: NCCL
    # 2.28 ran 24 channels), so samplers that model order see it between its neighbours in effect. MIN=MAX
    # forces the count (the docs' advice when benchmarking); 64 CTAs since 2.25, 32 before.
    CatalogueDimension(
        "channels",
        ("NCCL_MIN_CTAS", "NCCL_MAX_CTAS"),
        tuple(None if c is None else (c, c) for c in (1, 2, 4, 8, 12, 16, None, 24, 32, 48, 64)),
        ordered=True,
        reason="NCCL_MIN_CTAS=NCCL_MAX_CTAS forces the channel count",
        since=(2, 17, 0),
        cap=((2, 25, 0), 32),
    ),
    # Multiples of 32 within 64..512, the documented set. Unset is 512 (or 256 on slow PCI rings).
    CatalogueDimension(
        "nthreads", ("NCCL_NTHREADS",), ((64,), (128,), (256,), None), ordered=True, reason="threads per CTA"
    ),
    # Per peer and per channel: bounded so memory cannot blow up. Unset is 4 MiB, in its place.
    CatalogueDimension(
        "buffsize",
        ("NCCL_BUFFSIZE",),
        ((1 * _MIB,), (2 * _MIB,), None, (8 * _MIB,), (16 * _MIB,)),
        ordered=True,
        reason="per-peer, per-channel buffer size (bounded at 16 MiB)",
    ),
    CatalogueDimension(
        "ib_qps",
        ("NCCL_IB_QPS_PER_CONNECTION",),
        (None, (2,), (4,), (8,)),
        ordered=True,
        reason="more QPs spread flows over ECMP paths",
        since=(2, 10, 0),
        needs=_MULTI_IB,
    ),
    CatalogueDimension(
        "ib_split",
        ("NCCL_IB_SPLIT_DATA_ON_QPS",),
        (None, (0,), (1,)),
        ordered=False,
        reason="round-robin or split data over the QPs",
        since=(2, 18, 0),
        needs=_MULTI_IB,
    ),
    # Unset is 2; leaving it unset is only a choice when the fabric tolerates 2.
    CatalogueDimension(
        "cross_nic",
        ("NCCL_CROSS_NIC",),
        (None, (0,), (1,)),
        ordered=False,
        reason="rail affinity of rings",
        needs=frozenset({Need.MULTI_NODE, Need.IB_OR_SOCKET, Need.CROSS_NIC_VALUES}),
    ),
    # Every product <= 64, as NCCL requires.
    CatalogueDimension(
        "socket_threads",
        ("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"),
        (None, (2, 2), (4, 1), (4, 4), (2, 8), (8, 8)),
        ordered=True,
        reason="socket transport threads x sockets per thread (product <= 64)",
        needs=frozenset({Need.MULTI_NODE, Need.SOCKET}),
        names="x",
    ),
    # Only 0 is a safe explicit value: 1/2 fail init where NVLS resources cannot be allocated (2.29+).
    CatalogueDimension(
        "nvls",
        ("NCCL_NVLS_ENABLE",),
        (None, (0,)),
        ordered=False,
        reason="NVLink SHARP on (default) or off",
        since=(2, 17, 0),
        needs=frozenset({Need.NVLS}),
    ),
    CatalogueDimension(
        "pxn",
        ("NCCL_PXN_DISABLE",),
        (None, (1,)),
        ordered=False,
        reason="send through a peer GPU's NIC",
        since=(2, 12, 0),
        needs=_MULTI_IB,
    ),
    CatalogueDimension(
        "p2p_chunk",
        ("NCCL_P2P_NET_CHUNKSIZE",),
        ((64 * _KIB,), None, (256 * _KIB,), (512 * _KIB,)),
        ordered=True,
        reason="network chunk size of send/recv and alltoall",
        since=(2, 14, 0),
        needs=_MULTI_P2P,
    ),
    CatalogueDimension(
        "net_peer_channels",
        ("NCCL_NCHANNELS_PER_NET_PEER",),
        ((1,), None, (4,)),
        ordered=True,
        reason="channels per network peer (alltoall); 8 hurt in NVIDIA/nccl issue #1316",
        needs=_MULTI_P2P,
    ),
)

CATALOGUE = Catalogue(_VARIABLES, _DIMENSIONS)
"""The one catalogue. Code that must see an extended one in tests reads this attribute at call time."""
