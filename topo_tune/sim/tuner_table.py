"""A simulated sweep under a tuner-plugin table: per size, the plugin's choice as the model plays NCCL.

Purpose: let a ``sim`` study measure a candidate table (``nccl_tuner.conf``'s columns) the way the ``nccl``
backend does with the real plugin. For each size, the first table row that matches it (collective, size
range, the communicator's nNodes/nRanks) and whose algorithm/protocol the model can run decides: the model is
restricted to that entry (``NCCL_ALGO``/``NCCL_PROTO``; a row naming an entry the model's NCCL does not
offer at that size is passed over, as the plugin passes over NCCL's -1 entries) and runs the row's channel
count, capped at the communicator's own as NCCL caps a plugin's. Rows with algorithm/protocol -1 only set
the channel count, on the algorithm/protocol NCCL picks without the table (NCCL selects before it applies a
plugin's channel count). Each variant is simulated over the whole ladder with the same seed, so every size
keeps the noise draw it had without the table (common random numbers).

Non-goals: validating tables beyond :func:`~topo_tune.plugin.table.parse_tuner_table`, and NCCL's cost
model (the model's own choice stands wherever no row applies).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from topo_tune.errors import SimInputError
from topo_tune.plugin.table import parse_tuner_table
from topo_tune.sim.cluster import Cluster
from topo_tune.sim.simulate import SimResult, simulate

__all__ = ["simulate_with_table"]

# The plugin's names -> NCCL_ALGO/NCCL_PROTO's.
_NCCL_ALGO = {
    "ring": "Ring",
    "tree": "Tree",
    "nvls": "NVLS",
    "nvls_tree": "NVLSTree",
    "collnet_direct": "CollnetDirect",
    "collnet_chain": "CollnetChain",
    "pat": "PAT",
}
_NCCL_PROTO = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}


def simulate_with_table(
    cluster: Cluster,
    *,
    collective: str,
    sizes: Sequence[int],
    env: Mapping[str, str],
    rank_order: Sequence[str],
    seed: int,
    table: str,
    dtype: str = "float32",
) -> SimResult:
    """``simulate`` with ``table`` applied per size; with an empty table, exactly ``simulate``.

    Raises:
        SimInputError: as ``simulate``.
        TunerTableError: the table is malformed (line and field named).
    """
    order = tuple(rank_order)
    base = simulate(cluster, collective=collective, sizes=sizes, env=env, rank_order=order, seed=seed, dtype=dtype)
    name = base.collective.plugin_name  # point-to-point never reaches a tuner
    rows = parse_tuner_table(table) if table else ()
    rows = tuple(r for r in rows if r.fits(n_nodes=base.nodes, n_ranks=base.nranks))
    if name is None or not rows:
        return base
    comm_channels = max(s.channels for s in base.sizes)
    variants: dict[tuple[tuple[str, str], ...], SimResult | None] = {}
    chosen = []
    for index, size in enumerate(sizes):
        picked = base.sizes[index]
        for row in (r for r in rows if r.applies(name, size)):
            if row.algorithm is not None and f"{row.algorithm}/{row.protocol}" not in picked.offered:
                continue  # an entry NCCL's cost table ruled out (-1): the plugin passes the row over (NCCL_FACTS §3)
            variant = dict(env)
            if row.algorithm is not None and row.protocol is not None:
                variant.update(NCCL_ALGO=_NCCL_ALGO[row.algorithm], NCCL_PROTO=_NCCL_PROTO[row.protocol])
            else:
                # NCCL picks from the cost table before it applies a plugin's channel count (enqueue.cc: the
                # tuner's nChannels only overrides nMaxChannels afterwards), so a channel-only row keeps the
                # pick NCCL makes without it; forcing the count in the environment would let it move the pick.
                own = base.sizes[index]
                variant.update(NCCL_ALGO=own.algorithm, NCCL_PROTO=own.protocol)
            if row.channels is not None:
                channels = str(min(row.channels, comm_channels))
                variant.update(NCCL_MIN_CTAS=channels, NCCL_MAX_CTAS=channels)
            key = tuple(sorted(variant.items()))
            if key not in variants:
                try:
                    variants[key] = simulate(
                        cluster,
                        collective=collective,
                        sizes=sizes,
                        env=variant,
                        rank_order=order,
                        seed=seed,
                        dtype=dtype,
                    )
                except SimInputError:
                    variants[key] = None  # the model cannot run that entry here: NCCL's -1
            result = variants[key]
            if result is not None:
                own = base.sizes[index]
                # NCCL offered and would have picked what it does without the table; the row decided what ran.
                picked = dataclasses.replace(
                    result.sizes[index], offered=own.offered, nccl=own.nccl, row_channels=row.channels or 0
                )
                break
        chosen.append(picked)
    return dataclasses.replace(base, sizes=tuple(chosen))
