"""The search space: which NCCL knobs a study may change, to which values, for one NCCL version and fabric.

Purpose: a declarative catalogue of the knobs that only affect performance (safe to search, given identical
values on every rank; NCCL's env.rst and performance-tuning guide), each with a bounded set of values and the
NCCL version that introduced it, plus the rank order as a categorical dimension over named candidate orders
the caller supplies. Every dimension has a "leave it unset" value, and the baseline is every dimension unset
with NCCL's natural order. Knobs that can hang a job or corrupt data are refused by name with the reason;
site-fixed settings (IB HCA, GID index, traffic class, socket interface …) pass unchanged into every trial.

Non-goals: sampling (the study does it) and measuring anything. The space is plain data: the same inputs give
the same dimensions, and :meth:`SearchSpace.fingerprint` changes when anything that shapes a trial changes, so
a resumed study can refuse a space it was not started with.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from topo_tune.errors import ConfigError, UnsafeKnobError
from topo_tune.nccl import variables as catalogue
from topo_tune.nccl.collectives import Collective
from topo_tune.nccl.variables import CATALOGUE

__all__ = [
    "FORBIDDEN",
    "NATURAL_ORDER",
    "RANK_ORDER",
    "SITE_FIXED_KEYS",
    "SPACE_VERSION",
    "UNSET",
    "Dimension",
    "Fabric",
    "RankOrder",
    "SearchSpace",
    "TrialConfig",
    "UnsafeKnobError",
    "parse_nccl_version",
]

SPACE_VERSION = 1
"""Bumped whenever the catalogue below changes meaning; part of every space's fingerprint."""

UNSET = "default"
"""The value of a dimension that leaves its variables unset (NCCL's automatic choice)."""

RANK_ORDER = "rank_order"
"""The name of the rank-order dimension."""

NATURAL_ORDER = "natural"
"""The candidate-order name of NCCL's natural order (ranks as the launcher hands them out)."""

_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:[-+.].*)?\Z")
P2P_COLLECTIVES = frozenset(c.value for c in Collective if c.point_to_point)

FORBIDDEN: Mapping[str, str] = CATALOGUE.never_searched
"""Knobs no study searches, with the reason a user asking for one is told (from the catalogue)."""

SITE_FIXED_KEYS = CATALOGUE.site
"""Settings a site fixes once (fabric, QoS, interfaces); never searched, always passed through."""


def parse_nccl_version(text: str) -> tuple[int, int, int]:
    """``"2.28.3"`` (or ``"2.28"``, ``"2.28.3-1"``) → ``(2, 28, 3)``; :class:`ConfigError` otherwise."""
    match = _VERSION.match(text.strip())
    if match is None:
        raise ConfigError("nccl_version", f"expected MAJOR.MINOR[.PATCH], got {text!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


@dataclass(frozen=True)
class Fabric:
    """What the cluster's network allows; decides which knobs mean anything here.

    ``cross_nic_values`` lists the NCCL_CROSS_NIC values the fabric tolerates (a rail-optimized fabric whose
    rails do not meet may forbid 1; a site with PFC trouble may forbid 2's ring swaps).
    """

    nodes: int
    ib: bool = True
    socket: bool = False
    nvls: bool = False
    cross_nic_values: tuple[int, ...] = (0, 1, 2)

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ConfigError("fabric.nodes", f"must be at least 1, got {self.nodes}")
        bad = [v for v in self.cross_nic_values if v not in (0, 1, 2)]
        if bad:
            raise ConfigError("fabric.cross_nic_values", f"NCCL_CROSS_NIC is 0, 1 or 2, got {bad}")

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1


@dataclass(frozen=True)
class Dimension:
    """One searched dimension: its named values, each mapping to the variables it sets.

    ``ordered`` dimensions have values on a scale (channel counts, sizes), so samplers that model numbers
    (TPE, CMA-ES) see them as integers 0..k-1 in this order; the others are categorical.
    """

    name: str
    values: tuple[str, ...]
    settings: Mapping[str, Mapping[str, str]]
    ordered: bool
    reason: str

    @property
    def default(self) -> str:
        return UNSET


@dataclass(frozen=True)
class RankOrder:
    """A named candidate order of the job's nodes (ranks are contiguous per node, in this order)."""

    name: str
    nodes: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.name or not re.match(r"^[A-Za-z0-9_.\-]+$", self.name):
            raise ConfigError("rank_orders[].name", f"must be a non-empty word, got {self.name!r}")
        if not self.nodes:
            raise ConfigError(f"rank_orders[{self.name}].nodes", "must name at least one node")
        if len(set(self.nodes)) != len(self.nodes):
            raise ConfigError(f"rank_orders[{self.name}].nodes", "names a node twice")


@dataclass(frozen=True)
class TrialConfig:
    """What one trial runs: the full environment (site-fixed settings included) and the rank order."""

    env: Mapping[str, str]
    rank_order: RankOrder
    params: Mapping[str, str] = field(default_factory=dict)
    tuner_table: str = ""
    """A candidate tuner-plugin table the trial runs with (per-size choices); empty: none."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(sorted(self.env.items()))))
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))

    def tuned_env(self, site_fixed: Mapping[str, str]) -> dict[str, str]:
        """The variables the search chose (the environment minus the site-fixed settings)."""
        return {k: v for k, v in self.env.items() if k not in site_fixed}


def _dimension(name: str, values: Sequence[tuple[str, Mapping[str, str]]], *, ordered: bool, reason: str) -> Dimension:
    return Dimension(
        name=name,
        values=tuple(v for v, _ in values),
        settings=MappingProxyType({v: MappingProxyType(dict(s)) for v, s in values}),
        ordered=ordered,
        reason=reason,
    )


def _applies(dim: catalogue.CatalogueDimension, version: tuple[int, int, int], fabric: Fabric, p2p: bool) -> bool:
    met = {
        catalogue.Need.MULTI_NODE: fabric.multi_node,
        catalogue.Need.IB: fabric.ib,
        catalogue.Need.SOCKET: fabric.socket,
        catalogue.Need.IB_OR_SOCKET: fabric.ib or fabric.socket,
        catalogue.Need.NVLS: fabric.nvls,
        catalogue.Need.P2P_COLLECTIVES: p2p,
        catalogue.Need.CROSS_NIC_VALUES: True,
    }
    return version >= dim.since and all(met[need] for need in dim.needs)


def _values(
    dim: catalogue.CatalogueDimension, version: tuple[int, int, int], fabric: Fabric
) -> list[tuple[int, ...] | None]:
    values = list(dim.values)
    if dim.cap is not None and version < dim.cap[0]:
        values = [v for v in values if v is None or max(v) <= dim.cap[1]]
    if catalogue.Need.CROSS_NIC_VALUES in dim.needs:
        # Unset is 2: leaving it unset is only a choice when the fabric tolerates 2.
        values = [v for v in values if (2 if v is None else v[0]) in fabric.cross_nic_values]
    return values


def _catalogue(version: tuple[int, int, int], fabric: Fabric, collectives: frozenset[str]) -> dict[str, Dimension]:
    """Every knob of the catalogue that applies to this NCCL version, fabric and workload, in its order."""
    dims: dict[str, Dimension] = {}
    p2p = bool(collectives & P2P_COLLECTIVES)
    for spec in catalogue.CATALOGUE.dimensions:
        if not _applies(spec, version, fabric, p2p):
            continue
        values = _values(spec, version, fabric)
        if len(values) < 2:
            continue  # one value is no choice
        dims[spec.name] = _dimension(
            spec.name,
            [
                (UNSET, {})
                if v is None
                else (str(spec.value_name(v)), {k: str(x) for k, x in zip(spec.variables, v, strict=True)})
                for v in values
            ],
            ordered=spec.ordered,
            reason=spec.reason,
        )
    return dims


def check_site_fixed(site: Mapping[str, str]) -> None:
    """``ConfigError`` naming ``site_fixed.KEY`` for a key that is no site setting or a value NCCL cannot take;
    ``UnsafeKnobError`` for one that can hang a job. Checked when a space is built and when a study is asked
    for, before it runs."""
    for key, value in site.items():
        if key not in SITE_FIXED_KEYS:
            raise ConfigError(f"site_fixed.{key}", f"not a site setting; allowed: {', '.join(sorted(SITE_FIXED_KEYS))}")
        if not value or value != value.strip():
            raise ConfigError(f"site_fixed.{key}", f"empty or padded value {value!r}")
    if site.get("NCCL_IB_TIMEOUT") is not None and _int_or_none(site["NCCL_IB_TIMEOUT"]) in (0, *range(32, 256)):
        raise UnsafeKnobError("site_fixed.NCCL_IB_TIMEOUT", FORBIDDEN["NCCL_IB_TIMEOUT"])


def _search_name(key: str) -> str:
    return key if key.startswith("NCCL_") else "NCCL_" + key


@dataclass(frozen=True)
class SearchSpace:
    """The dimensions of one study. Build it with :meth:`build`."""

    nccl_version: tuple[int, int, int]
    dimensions: tuple[Dimension, ...]
    rank_orders: tuple[RankOrder, ...]
    site_fixed: Mapping[str, str]

    @classmethod
    def build(
        cls,
        *,
        nccl_version: str,
        fabric: Fabric,
        collectives: Sequence[str],
        rank_orders: Sequence[RankOrder],
        site_fixed: Mapping[str, str] | None = None,
        knobs: Sequence[str] | None = None,
    ) -> SearchSpace:
        """The space for this NCCL version, fabric and workload.

        ``rank_orders`` must start with NCCL's natural order (named :data:`NATURAL_ORDER`); the others are
        candidates (the ring-order optimizer's, the naive hostname order …), all over the same nodes.
        ``knobs`` restricts the search to the named dimensions or variables (``channels``,
        ``NCCL_NTHREADS``, ``IB_QPS_PER_CONNECTION`` …); ``None`` searches every knob that applies.
        Raises :class:`UnsafeKnobError` for a knob that can hang or corrupt, and :class:`ConfigError` naming
        the argument for anything else that cannot be searched.
        """
        version = parse_nccl_version(nccl_version)
        site = dict(site_fixed or {})
        check_site_fixed(site)
        orders = tuple(rank_orders)
        if not orders or orders[0].name != NATURAL_ORDER:
            raise ConfigError("rank_orders", f"must start with NCCL's natural order, named {NATURAL_ORDER!r}")
        names = [o.name for o in orders]
        if len(set(names)) != len(names):
            raise ConfigError("rank_orders", f"names must be unique, got {names}")
        for order in orders[1:]:
            if sorted(order.nodes) != sorted(orders[0].nodes):
                raise ConfigError(f"rank_orders[{order.name}].nodes", "must list the natural order's nodes")
        if len(orders[0].nodes) != fabric.nodes:
            raise ConfigError(
                "rank_orders", f"the orders list {len(orders[0].nodes)} nodes, fabric.nodes is {fabric.nodes}"
            )
        catalogue = _catalogue(version, fabric, frozenset(collectives))
        chosen = list(catalogue.values()) if knobs is None else _select(knobs, catalogue, version)
        return cls(
            nccl_version=version,
            dimensions=tuple(chosen),
            rank_orders=orders,
            site_fixed=MappingProxyType(site),
        )

    @property
    def names(self) -> tuple[str, ...]:
        extra = (RANK_ORDER,) if len(self.rank_orders) > 1 else ()
        return tuple(d.name for d in self.dimensions) + extra

    def values_of(self, name: str) -> tuple[str, ...]:
        if name == RANK_ORDER:
            return tuple(o.name for o in self.rank_orders)
        return self._dimension(name).values

    def is_ordered(self, name: str) -> bool:
        return name != RANK_ORDER and self._dimension(name).ordered

    def size(self) -> int:
        """How many distinct configurations the space holds (for exhaustive sweeps)."""
        total = 1
        for name in self.names:
            total *= len(self.values_of(name))
        return total

    def baseline_params(self) -> dict[str, str]:
        """Every knob unset and NCCL's natural order: the baseline every trial is compared with."""
        params = {d.name: UNSET for d in self.dimensions}
        if len(self.rank_orders) > 1:
            params[RANK_ORDER] = NATURAL_ORDER
        return params

    def params_for(self, *, env: Mapping[str, str] | None = None, rank_order: str = NATURAL_ORDER) -> dict[str, str]:
        """The params of a configuration given as variables (e.g. a topology-derived candidate).

        Every variable must be one a dimension of this space sets, to one of its values.
        """
        params = self.baseline_params()
        remaining = dict(env or {})
        for dim in self.dimensions:
            for value, settings in dim.settings.items():
                if settings and all(remaining.get(k) == v for k, v in settings.items()):
                    params[dim.name] = value
                    for k in settings:
                        remaining.pop(k)
                    break
        if remaining:
            key = sorted(remaining)[0]
            raise ConfigError(f"env.{key}", f"{remaining[key]!r} is not a value this search space holds")
        if rank_order not in {o.name for o in self.rank_orders}:
            raise ConfigError(
                "rank_order", f"unknown order {rank_order!r}; known: {[o.name for o in self.rank_orders]}"
            )
        if len(self.rank_orders) > 1:
            params[RANK_ORDER] = rank_order
        return params

    def config(self, params: Mapping[str, str]) -> TrialConfig:
        """The trial configuration of ``params`` (every dimension named, each to one of its values)."""
        env = dict(self.site_fixed)
        for dim in self.dimensions:
            value = params.get(dim.name, "")
            if value not in dim.settings:
                raise ConfigError(f"params.{dim.name}", f"{value!r} is not one of {list(dim.values)}")
            env.update(dim.settings[value])
        order_name = params.get(RANK_ORDER, NATURAL_ORDER)
        orders = {o.name: o for o in self.rank_orders}
        if order_name not in orders:
            raise ConfigError(f"params.{RANK_ORDER}", f"{order_name!r} is not one of {list(orders)}")
        return TrialConfig(env=env, rank_order=orders[order_name], params=dict(params))

    def fingerprint(self) -> str:
        """A hash of everything that shapes a trial: a resumed study must see the same one."""
        payload = {
            "space_version": SPACE_VERSION,
            "nccl": list(self.nccl_version),
            "dimensions": [[d.name, [[v, dict(d.settings[v])] for v in d.values]] for d in self.dimensions],
            "rank_orders": [[o.name, list(o.nodes)] for o in self.rank_orders],
            "site_fixed": dict(sorted(self.site_fixed.items())),
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def _dimension(self, name: str) -> Dimension:
        for dim in self.dimensions:
            if dim.name == name:
                return dim
        raise ConfigError("dimension", f"{name!r} is not a dimension of this space; known: {list(self.names)}")


def _int_or_none(text: str) -> int | None:
    try:
        return int(text, 0)
    except ValueError:
        return None


def _select(knobs: Sequence[str], catalogue: Mapping[str, Dimension], version: tuple[int, int, int]) -> list[Dimension]:
    by_variable = {k: d.name for d in catalogue.values() for s in d.settings.values() for k in s}
    wanted: set[str] = set()
    for raw in knobs:
        if raw in catalogue:
            wanted.add(raw)
            continue
        key = _search_name(raw.strip().upper())
        if key in FORBIDDEN:
            raise UnsafeKnobError(f"knobs.{raw}", f"{key} is never searched: {FORBIDDEN[key]}")
        if key in SITE_FIXED_KEYS:
            raise ConfigError(
                f"knobs.{raw}", f"{key} is a site setting: fix it in the cluster file, it is not searched"
            )
        if key not in by_variable:
            raise ConfigError(
                f"knobs.{raw}",
                f"{key} is not searchable with NCCL {'.'.join(map(str, version))} on this fabric and workload; "
                f"searchable: {', '.join(sorted(catalogue))}",
            )
        wanted.add(by_variable[key])
    return [d for name, d in catalogue.items() if name in wanted]
