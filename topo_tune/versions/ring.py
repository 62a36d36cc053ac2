"""A config version's ring as its ``rankmap.json`` holds it: the planned node order and the pair matrix.

Purpose: read (and so check, naming the field) what ``tuner/ring/rank_map.py`` writes, for the places that plan or
predict on it: a job's node order (``tuner/ring/job_order.py``) and the check a version passes before anything
stores or stages it (``config_version.check_rank_map``). It sits below both and needs only NumPy.
Non-goals: planning rings (``tuner/ring/optimizer.py``) and writing rank maps.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from topo_tune.errors import ValidationError

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class VersionRing:
    """What a version's rank map says about node order: its ring and (when carried) its pair matrix."""

    order: tuple[str, ...]
    names: tuple[str, ...] = ()
    """The matrix's nodes, sorted; empty when the rank map carries no matrix."""
    bandwidth: FloatArray | None = None
    latency: FloatArray | None = None
    sources: FloatArray | None = None
    """Per pair: 1 where the figure was measured, 0 where it was modelled or inferred."""
    racks: tuple[str, ...] | None = None
    tiers: tuple[tuple[str, ...], ...] | None = None
    """Per node of ``names``: the network tiers above its rack, top first (None: the rank map names none)."""

    def index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}

    def predict(self, order: Sequence[str]) -> float | None:
        """The ring bottleneck of ``order`` on the matrix (GB/s); inf for one node; None when not predictable."""
        if len(order) < 2:
            return math.inf
        index = self.index()
        if self.bandwidth is None or self.latency is None or any(n not in index for n in order):
            return None
        idx = np.asarray([index[n] for n in order])
        return float(self.bandwidth[idx, np.roll(idx, -1)].min())

    def measured_edges(self, order: Sequence[str]) -> tuple[int, int]:
        """(measured, all) edges of the ring ``order`` on the matrix: how much of a prediction was measured."""
        index = self.index()
        if self.sources is None or len(order) < 2 or any(n not in index for n in order):
            return 0, 0
        edges = [(order[i], order[(i + 1) % len(order)]) for i in range(len(order))][: 1 if len(order) == 2 else None]
        return sum(int(self.sources[index[a], index[b]]) for a, b in edges), len(edges)


def read_rank_map(text: str) -> VersionRing:
    """Parse a version's ``rankmap.json``; a malformed one is a `ValidationError` naming the field."""
    try:
        data = json.loads(text)
    except ValueError as error:
        raise ValidationError("rankmap.json", f"not JSON: {error}") from None
    if not isinstance(data, dict):
        raise ValidationError("rankmap.json", "not a JSON object")
    order = _strings(_get(data, "planned", dict).get("node_order"), "planned.node_order")
    matrix = data.get("pair_matrix")
    if matrix is None:
        return VersionRing(order=order)
    if not isinstance(matrix, dict):
        raise ValidationError("rankmap.json:pair_matrix", "not an object")
    names = _strings(matrix.get("nodes"), "pair_matrix.nodes")
    if list(names) != sorted(set(names)):
        raise ValidationError("rankmap.json:pair_matrix.nodes", "must be sorted and unique")
    bandwidth = _triangle(matrix.get("bandwidth_gbps"), len(names), "bandwidth_gbps", diagonal=math.inf)
    latency = _triangle(matrix.get("latency_us"), len(names), "latency_us", diagonal=0.0)
    codes = matrix.get("sources")
    sources = None
    if codes is not None:
        if not isinstance(codes, list) or not all(isinstance(c, str) for c in codes):
            raise ValidationError("rankmap.json:pair_matrix.sources", "must be a list of strings")
        rows = [[1.0 if ch == "m" else 0.0 for ch in row] for row in codes]
        sources = _triangle(rows, len(names), "sources", diagonal=0.0)
    if bool((bandwidth <= 0).any()) or bool((latency < 0).any()):
        raise ValidationError("rankmap.json:pair_matrix", "bandwidth must be positive and latency not negative")
    racks = matrix.get("racks")
    rack_labels = None
    if racks is not None:
        rack_labels = _strings(racks, "pair_matrix.racks")
        if len(rack_labels) != len(names):
            raise ValidationError("rankmap.json:pair_matrix.racks", f"{len(rack_labels)} labels for {len(names)} nodes")
    return VersionRing(order, names, bandwidth, latency, sources, rack_labels, _tiers(matrix.get("tiers"), len(names)))


def _tiers(value: object, n: int) -> tuple[tuple[str, ...], ...] | None:
    if value is None:
        return None
    field = "rankmap.json:pair_matrix.tiers"
    if not isinstance(value, list) or len(value) != n:
        raise ValidationError(field, f"must be a list of one list of tier names per node ({n})")
    if not all(isinstance(t, list) and all(isinstance(v, str) and v for v in t) for t in value):
        raise ValidationError(field, "each entry must be a list of non-empty strings")
    return tuple(tuple(t) for t in value)


def _get(data: dict[str, Any], key: str, kind: type) -> Any:
    value = data.get(key)
    if not isinstance(value, kind):
        raise ValidationError(f"rankmap.json:{key}", f"missing or not a {kind.__name__}")
    return value


def _strings(value: object, field: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValidationError(f"rankmap.json:{field}", "must be a list of non-empty strings")
    return tuple(value)


def _triangle(rows: object, n: int, field: str, *, diagonal: float) -> FloatArray:
    """A symmetric matrix from upper-triangle rows (row i: the pairs (i, j) for j > i)."""
    out = np.full((n, n), diagonal, dtype=np.float64)
    if n < 2:
        return out
    if not isinstance(rows, list) or len(rows) != n - 1:
        raise ValidationError(f"rankmap.json:pair_matrix.{field}", f"must have {n - 1} rows for {n} nodes")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != n - 1 - i:
            raise ValidationError(f"rankmap.json:pair_matrix.{field}[{i}]", f"must have {n - 1 - i} entries")
        try:
            values = np.asarray(row, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValidationError(f"rankmap.json:pair_matrix.{field}[{i}]", "must hold numbers") from None
        if not np.isfinite(values).all():
            raise ValidationError(f"rankmap.json:pair_matrix.{field}[{i}]", "must hold finite numbers")
        out[i, i + 1 :] = values
        out[i + 1 :, i] = values
    return out
