"""A job's node order: the best ring over the job's own nodes, from the pair matrix its config version carries.

Purpose: NCCL chains nodes into its inter-node ring in the order of their lowest global rank (NCCL_FACTS §2.1),
so a job's node ranks *are* its ring. A version's ``rankmap.json`` holds the ring the study planned over all its
nodes and the pair matrix it was planned on; a job usually runs on part of them. :func:`job_order` answers,
for a version and a job's node set, the order to hand out node ranks in.

Why re-plan the subset rather than drop the other nodes from the version's ring: dropping a node joins its two
ring neighbours, and nothing says that pair is fast. With two racks joined by a slow spine, the full ring
crosses the spine exactly twice; take away the nodes between two crossings and the remaining ring may cross it
four times, or join two nodes whose direct link is the degraded one the full ring went around. The ring
optimizer over the job's own sub-matrix (exact up to 12 nodes, the heuristic above) sees those pairs. Both
rings are still compared on the matrix and the better one kept (ties: the version's, as what was measured).

Guarantees, each pinned by a test:
- **Deterministic**: a pure function of the rank map's text and the *set* of nodes. The launcher's order is
  taken as the sorted host names (what Slurm's node list and a sorted hostfile give, and what the study
  measured as NCCL's natural order), so the way nodes were listed never changes the answer. The controller
  also pins the answer with the job id, so every node of a job gets the same order however it was started.
- **Never worse than the launcher's order on the matrix**: the tuned ring replaces the launcher's order only
  if its predicted ring bottleneck is not lower (and, when it is equal, the version's measured ring or a
  lower summed latency speaks for it); otherwise the launcher's order is kept, and said so.
- **Unknown nodes** (not in the version's matrix) keep the launcher's relative order after the known ones,
  with a warning; the prediction is then unknown, since their links were never measured or modelled.
- No version (NCCL's defaults), or a version that kept NCCL's natural order (no rank map): the launcher's order.

Non-goals: storing the answer (the controller pins it), launching anything (``topo_tune.jobs.launchers``), and the
optimizer itself (``ring_order``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from topo_tune.errors import ValidationError
from topo_tune.tuner.ring.model import array_metrics, canonical_rotation
from topo_tune.tuner.ring.optimizer import optimize_ring
from topo_tune.versions.ring import VersionRing, read_rank_map

_REL = 1e-9
"""Bottlenecks this close (relative) are equal: the matrix is rounded to 4 decimals in the rank map."""

METHODS = {
    "defaults": "the launcher's order (NCCL's defaults: no config version)",
    "natural": "the launcher's order (the version keeps NCCL's natural order)",
    "version": "the version's ring",
    "dropped": "the version's ring with the other nodes left out",
    "replanned": "re-planned over the job's nodes",
    "given": "the launcher's order (the tuned ring is not better on the version's pair matrix)",
    "single": "one node: no inter-node ring",
    "pinned": "the order pinned with the job",
}
"""What each ``JobOrder.method`` means, as ``hostfile`` and ``env --output json`` say it."""


@dataclass(frozen=True)
class JobOrder:
    """The order to hand out a job's node ranks in, and what the version's matrix predicts for it."""

    order: tuple[str, ...]
    given: tuple[str, ...]
    """The launcher's order it is compared with: the job's nodes sorted by name."""
    method: str
    """A key of `METHODS`."""
    bottleneck_gbps: float | None
    """Predicted ring bottleneck of ``order`` (GB/s); inf for one node; None when the matrix cannot tell."""
    given_bottleneck_gbps: float | None
    warnings: tuple[str, ...] = ()
    measured_edges: tuple[int, int] = (0, 0)
    """(measured, all) edges of ``order``'s ring on the matrix."""

    def rank_of(self, node: str) -> int:
        return self.order.index(node)


def launcher_order(nodes: Sequence[str]) -> tuple[str, ...]:
    """The launcher's order as this module takes it: the job's distinct nodes, sorted by name."""
    return tuple(sorted(set(nodes)))


def job_order(rank_map: str | None, nodes: Sequence[str], *, version: str = "x") -> JobOrder:
    """The job's node order for a version whose ``rankmap.json`` is ``rank_map`` (None: the version has none).

    ``version`` "" means NCCL's defaults (no version at all). Raises `ValidationError` for an empty node list or
    a malformed rank map.
    """
    given = launcher_order(nodes)
    if not given:
        raise ValidationError("nodes", "a job needs at least one node")
    ring = read_rank_map(rank_map) if rank_map is not None else None  # a malformed map is refused, for any job
    if len(given) == 1:
        return JobOrder(given, given, "single", math.inf, math.inf)
    if ring is None:
        return JobOrder(given, given, "defaults" if not version else "natural", None, None)
    members = set(given)
    index = ring.index()
    in_ring = set(ring.order)
    known_set = members & (set(index) if ring.names else in_ring)
    known = tuple(n for n in given if n in known_set)
    unknown = tuple(n for n in given if n not in known_set)
    warnings: list[str] = []
    if unknown:
        warnings.append(
            f"{len(unknown)} node(s) not in the version's pair matrix ({_names(unknown)}): they keep the "
            "launcher's order after the known ones, and the ring cannot be predicted"
        )
    dropped = tuple(n for n in ring.order if n in known_set)
    dropped += tuple(n for n in known if n not in dropped)  # in the matrix but not on the version's ring
    full = known_set == in_ring and not unknown
    if ring.bandwidth is None or ring.latency is None or len(known) < 3:
        if ring.bandwidth is None and not full:
            warnings.append(
                "the version carries no pair matrix (planned over more nodes than a rank map holds, or made "
                "before rank maps carried one): its ring is used with the other nodes left out, not re-planned, "
                "and nothing can be predicted"
            )
        method = "version" if full else "dropped"
        return _answer(ring, dropped + unknown, given, method, warnings)
    version_ring = _score(ring, dropped)
    if full:
        tuned, method = dropped, "version"
    else:
        replanned = _replan(ring, known)
        tuned, method = (replanned, "replanned") if _score(ring, replanned) > version_ring else (dropped, "dropped")
    tuned_score, given_score = _score(ring, tuned), _score(ring, known)
    better = tuned_score[0] > given_score[0] or (
        tuned_score[0] == given_score[0] and (method == "version" or tuned_score[1] > given_score[1])
    )
    if not better:
        tuned, method = known, "given"
    return _answer(ring, tuned + unknown, given, method, warnings)


def pinned_order(rank_map: str | None, order: Sequence[str], *, version: str = "x") -> JobOrder:
    """An order pinned earlier, with what the version's matrix predicts for it and for the launcher's order."""
    ring = read_rank_map(rank_map) if rank_map is not None else VersionRing(order=())
    return _answer(ring, tuple(order), launcher_order(order), "pinned" if version else "defaults", [])


def _answer(
    ring: VersionRing, order: tuple[str, ...], given: tuple[str, ...], method: str, warnings: list[str]
) -> JobOrder:
    return JobOrder(
        order=order,
        given=given,
        method=method,
        bottleneck_gbps=ring.predict(order),
        given_bottleneck_gbps=ring.predict(given),
        warnings=tuple(warnings),
        measured_edges=ring.measured_edges(order),
    )


def _score(ring: VersionRing, order: Sequence[str]) -> tuple[float, float]:
    """(bottleneck, minus summed latency), with bottlenecks rounded so that equal ones compare equal."""
    assert ring.bandwidth is not None and ring.latency is not None
    index = ring.index()
    bottleneck, latency = array_metrics([index[n] for n in order], ring.bandwidth, ring.latency)
    return _rounded(bottleneck), -_rounded(latency)


def _rounded(value: float) -> float:
    if value == 0 or not math.isfinite(value):
        return value
    digits = -math.floor(math.log10(abs(value) * _REL))
    return round(value, digits)


def _replan(ring: VersionRing, known: tuple[str, ...]) -> tuple[str, ...]:
    """The optimizer's ring over ``known`` (sorted names), started at the first name, turned canonically."""
    assert ring.bandwidth is not None and ring.latency is not None
    index = ring.index()
    rows = [index[n] for n in known]
    sub_bw = ring.bandwidth[np.ix_(rows, rows)]
    sub_lat = ring.latency[np.ix_(rows, rows)]
    racks = [ring.racks[r] for r in rows] if ring.racks is not None else None
    tiers = [ring.tiers[r] for r in rows] if ring.tiers is not None else None
    planned = optimize_ring(sub_bw, sub_lat, racks=racks, tiers=tiers, seed=0)
    return tuple(known[i] for i in canonical_rotation(planned.order))


def _names(nodes: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(nodes[:limit])
    return shown + (f" and {len(nodes) - limit} more" if len(nodes) > limit else "")
