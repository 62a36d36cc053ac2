"""Collective names as traces and logs spell them, mapped onto the benchmarked collectives.

PyTorch names a call by its ``ProcessGroup`` method (``allreduce``, ``_allgather_base``,
``allgather_into_tensor_coalesced``, ``_reduce_scatter_base`` ...), gloo's annotations by the
``torch.distributed`` function (``gloo:all_reduce``), NCCL Inspector and the tuner plugin by NCCL's function
(``AllReduce``). Each name here is listed exactly: a name that is not (``barrier``, ``send``, ``gather`` ...)
is reported as skipped by the caller, never folded into a collective it only resembles.

Non-goal: sizes (each reader knows what its counts mean); the collectives themselves are
:class:`topo_tune.nccl.collectives.Collective`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from topo_tune.nccl.collectives import Collective

__all__ = ["collective_named"]

_NAMES: Final[Mapping[Collective, tuple[str, ...]]] = {
    Collective.ALL_REDUCE: ("allreduce", "all_reduce", "allreduce_coalesced", "all_reduce_coalesced"),
    Collective.ALL_GATHER: (
        "allgather",
        "all_gather",
        "allgather_base",
        "all_gather_base",
        "allgather_into_tensor",
        "all_gather_into_tensor",
        "allgather_coalesced",
        "allgather_into_tensor_coalesced",
        "all_gather_into_tensor_coalesced",
    ),
    Collective.REDUCE_SCATTER: (
        "reduce_scatter",
        "reducescatter",
        "reduce_scatter_base",
        "reduce_scatter_tensor",
        "reduce_scatter_tensor_coalesced",
    ),
    Collective.BROADCAST: ("broadcast", "broadcast_oop"),
    Collective.REDUCE: ("reduce", "reduce_oop"),
    Collective.ALLTOALL: ("alltoall", "all_to_all", "alltoall_base", "all_to_all_single"),
}

_BY_NAME: Final = {name: collective for collective, names in _NAMES.items() for name in names}


def collective_named(name: str) -> Collective | None:
    """The collective ``name`` is, or ``None`` when it is not one of the listed spellings.

    Case and one leading underscore do not matter (``_allgather_base``, ``AllGather``); nothing else is
    guessed.
    """
    key = name.strip().lower()
    key = key[1:] if key.startswith("_") else key
    return _BY_NAME.get(key)
