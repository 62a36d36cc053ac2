"""The one list of collectives, and each one's names: nccl-tests', the tuner plugin's, NCCL's own.

The CLI, the wire, the simulator, the tuner's workload and buckets and the tuner plugin's table all name a
collective through :class:`Collective`; every other spelling is a total mapping here, checked at import, so a
member added to the enum cannot be left out of one. Non-goal: the nccl-tests arithmetic of each collective
(``benchmark/collectives.py``).
"""

from __future__ import annotations

import enum

__all__ = ["PLUGIN_COLLECTIVES", "Collective"]


class Collective(enum.StrEnum):
    """A benchmarked (or simulated) collective, named as nccl-tests names its binaries (``all_reduce_perf``...).

    The one list of collectives: the CLI, the wire, the simulator, the tuner's buckets and the tuner plugin's
    table all name a collective through this enum. Its other spellings (the tuner plugin's and NCCL's
    ``ncclFunc`` names) are total mappings below, checked at import, so a new member cannot be left out of one.
    """

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALLTOALL = "alltoall"
    SENDRECV = "sendrecv"

    @property
    def reduces(self) -> bool:
        """Whether the collective applies a reduction (printed as ``sum``, else ``none``)."""
        return self in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.REDUCE)

    @property
    def root(self) -> int:
        """The root rank nccl-tests uses (``-r 0``); ``-1`` for collectives without a root."""
        return 0 if self in (Collective.BROADCAST, Collective.REDUCE) else -1

    @property
    def redop_name(self) -> str:
        return "sum" if self.reduces else "none"

    @property
    def checks_in_place(self) -> bool:
        """Whether an in-place run can be checked.

        nccl-tests reports ``N/A`` for in-place alltoall (NCCL has none); topo-tune also skips
        in-place sendrecv, where torch would send from and receive into one buffer at once.
        """
        return self not in (Collective.ALLTOALL, Collective.SENDRECV)

    @property
    def point_to_point(self) -> bool:
        """alltoall and sendrecv: NCCL runs them as send/recv pairs, never through a tuner or an algorithm."""
        return self in (Collective.ALLTOALL, Collective.SENDRECV)

    @property
    def plugin_name(self) -> str | None:
        """The tuner plugin's name (``allreduce``...); None for point-to-point, which never reaches a tuner."""
        return _PLUGIN_NAMES[self]

    @property
    def nccl_name(self) -> str:
        """NCCL's own name (``ncclFuncAllReduce`` without its prefix), as its logs and profiler print it."""
        return _NCCL_NAMES[self]

    @classmethod
    def from_plugin_name(cls, name: str) -> Collective:
        """The member the tuner plugin calls ``name``; ``ValueError`` naming the known ones otherwise."""
        for member, plugin_name in _PLUGIN_NAMES.items():
            if plugin_name == name:
                return member
        raise ValueError(f"unknown tuner-plugin collective {name!r}; known: {', '.join(PLUGIN_COLLECTIVES)}")


_PLUGIN_NAMES: dict[Collective, str | None] = {
    Collective.ALL_REDUCE: "allreduce",
    Collective.ALL_GATHER: "allgather",
    Collective.REDUCE_SCATTER: "reducescatter",
    Collective.BROADCAST: "broadcast",
    Collective.REDUCE: "reduce",
    Collective.ALLTOALL: None,
    Collective.SENDRECV: None,
}
_NCCL_NAMES: dict[Collective, str] = {
    Collective.ALL_REDUCE: "AllReduce",
    Collective.ALL_GATHER: "AllGather",
    Collective.REDUCE_SCATTER: "ReduceScatter",
    Collective.BROADCAST: "Broadcast",
    Collective.REDUCE: "Reduce",
    Collective.ALLTOALL: "AllToAll",
    Collective.SENDRECV: "SendRecv",
}
if set(_PLUGIN_NAMES) != set(Collective) or set(_NCCL_NAMES) != set(Collective):  # pragma: no cover - import check
    raise RuntimeError("every Collective needs its plugin and NCCL names")

_NCCL_FUNC_ORDER = (Collective.BROADCAST, Collective.REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER)
PLUGIN_COLLECTIVES: tuple[str, ...] = tuple(
    str(c.plugin_name) for c in (*_NCCL_FUNC_ORDER, Collective.ALL_REDUCE) if c.plugin_name is not None
)
"""The tuner plugin's collectives, in NCCL's ``ncclFunc_t`` order (the plugin's C table uses the same)."""
