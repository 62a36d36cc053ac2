"""NCCL environment variables, read the way NCCL reads them, into the values the model uses.

Covers the searchable knobs of the design's NCCL facts (§1.3) plus ``NCCL_ALGO``/``NCCL_PROTO`` in their
plain list form, so a measurement "with NCCL_ALGO=Ring" can be simulated. Variables the model has no
mechanism for (site settings such as ``NCCL_IB_HCA``, debugging switches) are accepted and ignored: they
pass through into the recorded environment unchanged.

Non-goals: deciding which knobs are safe to search (the tuner's search space does that) and NCCL's
per-collective list syntax (``allreduce:tree``), which is refused with a clear error.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from topo_tune.errors import SimInputError
from topo_tune.nccl.variables import CATALOGUE

_E = TypeVar("_E", bound=enum.Enum)


class Algorithm(enum.Enum):
    """NCCL collective algorithms the model knows."""

    # Members are singletons: an identity hash keeps the model's table lookups off Enum's slow __hash__.
    __hash__ = object.__hash__

    RING = "Ring"
    TREE = "Tree"
    NVLS = "NVLS"
    NVLS_TREE = "NVLSTree"


class Protocol(enum.Enum):
    """NCCL protocols: LL (8-byte lines, half payload), LL128 (128-byte lines), Simple (bulk + fences)."""

    # Members are singletons: an identity hash keeps the model's table lookups off Enum's slow __hash__.
    __hash__ = object.__hash__

    LL = "LL"
    LL128 = "LL128"
    SIMPLE = "Simple"


# NCCL also accepts these algorithm names; the model has no CollNet/PAT hardware, so they select nothing.
_OTHER_ALGOS = frozenset({"collnetdirect", "collnetchain", "pat"})

DEFAULT_BUFFSIZE = 4 * 1024 * 1024
DEFAULT_P2P_NET_CHUNKSIZE = 128 * 1024
DEFAULT_P2P_NVL_CHUNKSIZE = 512 * 1024
MAX_CHANNELS = 64
MAX_THREADS = 512  # threads per CTA at most (NCCL_NTHREADS)


@dataclass(frozen=True)
class NcclKnobs:
    """The environment as the model sees it; ``None`` means unset (NCCL's automatic choice)."""

    min_ctas: int | None = None
    max_ctas: int | None = None
    nthreads: int | None = None
    buffsize: int = DEFAULT_BUFFSIZE
    ib_qps_per_connection: int = 1
    ib_split_data_on_qps: bool = False
    cross_nic: int = 2
    socket_nthreads: int = 1
    nsocks_perthread: int = 1
    nvls_enable: int = 2
    pxn_disable: bool = False
    p2p_net_chunksize: int = DEFAULT_P2P_NET_CHUNKSIZE
    p2p_nvl_chunksize: int = DEFAULT_P2P_NVL_CHUNKSIZE
    nchannels_per_net_peer: int = 2
    algorithms: frozenset[Algorithm] | None = None
    protocols: frozenset[Protocol] | None = None


MODELLED_VARIABLES = CATALOGUE.simulated
"""The variables the model reads (the catalogue's ``sim`` column); everything else is ignored."""

_CACHE: dict[tuple[tuple[str, str], ...], NcclKnobs] = {}
_CACHE_LIMIT = 4096


def parse_env(env: Mapping[str, str]) -> NcclKnobs:
    """Read ``env`` as NCCL would; :class:`SimInputError` names the variable of any bad value."""
    key = tuple(sorted((k, v) for k, v in env.items() if k in MODELLED_VARIABLES))
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    knobs = _parse(dict(key))
    if len(_CACHE) >= _CACHE_LIMIT:
        _CACHE.clear()
    _CACHE[key] = knobs
    return knobs


def _parse(env: dict[str, str]) -> NcclKnobs:
    # NCCL_MIN/MAX_CTAS replaced the *_NCHANNELS pair in 2.17; when both are given the CTAS one wins.
    min_ctas = _int(env, "NCCL_MIN_CTAS", 1, MAX_CHANNELS)
    if min_ctas is None:
        min_ctas = _int(env, "NCCL_MIN_NCHANNELS", 1, MAX_CHANNELS)
    max_ctas = _int(env, "NCCL_MAX_CTAS", 1, MAX_CHANNELS)
    if max_ctas is None:
        max_ctas = _int(env, "NCCL_MAX_NCHANNELS", 1, MAX_CHANNELS)
    nthreads = _int(env, "NCCL_NTHREADS", 64, MAX_THREADS)
    if nthreads is not None and nthreads % 32:
        raise SimInputError("env.NCCL_NTHREADS", f"must be a multiple of 32, got {nthreads}")
    socket_nthreads = _int(env, "NCCL_SOCKET_NTHREADS", 1, 16) or 1
    nsocks = _int(env, "NCCL_NSOCKS_PERTHREAD", 1, 64) or 1
    if socket_nthreads * nsocks > 64:
        raise SimInputError(
            "env.NCCL_NSOCKS_PERTHREAD",
            f"NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD must be <= 64, got {socket_nthreads * nsocks}",
        )
    return NcclKnobs(
        min_ctas=min_ctas,
        max_ctas=max_ctas,
        nthreads=nthreads,
        buffsize=_int(env, "NCCL_BUFFSIZE", 64 * 1024, 1 << 30) or DEFAULT_BUFFSIZE,
        ib_qps_per_connection=_int(env, "NCCL_IB_QPS_PER_CONNECTION", 1, 128) or 1,
        ib_split_data_on_qps=_flag(env, "NCCL_IB_SPLIT_DATA_ON_QPS"),
        cross_nic=_choice(env, "NCCL_CROSS_NIC", (0, 1, 2), 2),
        socket_nthreads=socket_nthreads,
        nsocks_perthread=nsocks,
        nvls_enable=_choice(env, "NCCL_NVLS_ENABLE", (0, 1, 2), 2),
        pxn_disable=_flag(env, "NCCL_PXN_DISABLE"),
        p2p_net_chunksize=_int(env, "NCCL_P2P_NET_CHUNKSIZE", 4096, 1 << 30) or DEFAULT_P2P_NET_CHUNKSIZE,
        p2p_nvl_chunksize=_int(env, "NCCL_P2P_NVL_CHUNKSIZE", 4096, 1 << 30) or DEFAULT_P2P_NVL_CHUNKSIZE,
        nchannels_per_net_peer=_int(env, "NCCL_NCHANNELS_PER_NET_PEER", 1, MAX_CHANNELS) or 2,
        algorithms=_parse_list("NCCL_ALGO", env.get("NCCL_ALGO"), Algorithm, _OTHER_ALGOS),
        protocols=_parse_list("NCCL_PROTO", env.get("NCCL_PROTO"), Protocol, frozenset()),
    )


def _int(env: dict[str, str], name: str, low: int, high: int) -> int | None:
    raw = env.get(name)
    if raw is None:
        return None
    try:
        value = int(raw.strip(), 0)
    except ValueError:
        raise SimInputError(f"env.{name}", f"not an integer: {raw!r}") from None
    if not low <= value <= high:
        raise SimInputError(f"env.{name}", f"must be within {low}..{high}, got {value}")
    return value


def _flag(env: dict[str, str], name: str) -> bool:
    return _choice(env, name, (0, 1), 0) == 1


def _choice(env: dict[str, str], name: str, allowed: tuple[int, ...], default: int) -> int:
    value = _int(env, name, min(allowed), max(allowed))
    return default if value is None else value


def _tokens(name: str, raw: str) -> tuple[bool, list[str]]:
    if ";" in raw or ":" in raw:
        raise SimInputError(f"env.{name}", f"per-collective lists are not modelled: {raw!r}")
    text = raw.strip()
    exclude = text.startswith("^")
    tokens = [t.strip().lower() for t in text.lstrip("^").split(",") if t.strip()]
    if not tokens:
        raise SimInputError(f"env.{name}", "empty list")
    return exclude, tokens


def _parse_list(name: str, raw: str | None, members: type[_E], ignored: frozenset[str]) -> frozenset[_E] | None:
    """NCCL's ``parseList``: a comma list of names (case-insensitive), or everything but them after ``^``."""
    if raw is None:
        return None
    exclude, tokens = _tokens(name, raw)
    by_name = {str(m.value).lower(): m for m in members}
    chosen: set[_E] = set()
    for token in tokens:
        if token in by_name:
            chosen.add(by_name[token])
        elif token not in ignored:
            raise SimInputError(f"env.{name}", f"unknown value {token!r}")
    return frozenset(set(members) - chosen) if exclude else frozenset(chosen)
