"""The tuner plugin's table a study ships (``nccl_tuner.conf``): the proven table, or rows from proven buckets.

When the promoted configuration ran a table, it is exactly that table; otherwise (when asked) one row per
bucket shown faster whose algorithm and protocol the benchmark reported (the sim backend and NCCL's TUNING
log do). Non-goals: composing candidate tables (``plugin_table``, ``size_options``), writing files (``outputs``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topo_tune.tuner.plugin_table import PLUGIN_COLLECTIVES, TABLE_HEADER
from topo_tune.tuner.statistics import Decision

if TYPE_CHECKING:
    from topo_tune.tuner.study import StudyOutcome

__all__ = ["PLUGIN_ALGORITHMS", "PLUGIN_PROTOCOLS", "TUNER_HEADER", "tuner_table"]

TUNER_HEADER = TABLE_HEADER
PLUGIN_ALGORITHMS = {
    "ring": "ring",
    "tree": "tree",
    "nvls": "nvls",
    "nvlstree": "nvls_tree",
    "nvls_tree": "nvls_tree",
    "collnetdirect": "collnet_direct",
    "collnet_direct": "collnet_direct",
    "collnetchain": "collnet_chain",
    "collnet_chain": "collnet_chain",
    "pat": "pat",
}
"""How benchmarks spell an algorithm (NCCL's log, the sim) -> the plugin's name."""
PLUGIN_PROTOCOLS = {"ll": "ll", "ll128": "ll128", "simple": "simple"}


def tuner_table(outcome: StudyOutcome, *, nodes: int, ranks: int, bucket_rows: bool = True) -> str:
    """The plugin CSV: the table the promoted configuration was measured and proven with, when it ran one;
    else (with ``bucket_rows``) one row per bucket shown faster whose algorithm/protocol the benchmark reported."""
    lines = [f"# {TUNER_HEADER}"]
    chosen = outcome.chosen
    if chosen is not None and chosen.config.tuner_table:
        return chosen.config.tuner_table
    if bucket_rows and chosen is not None and chosen.candidate is not None:
        for proof in chosen.buckets:
            if proof.decision is not Decision.FASTER or proof.collective not in PLUGIN_COLLECTIVES:
                continue
            samples = [
                s for s in chosen.candidate.samples if s.collective == proof.collective and proof.bucket.holds(s.bytes)
            ]
            algos = {(s.algorithm or "").lower() for s in samples}
            protos = {(s.protocol or "").lower() for s in samples}
            channels = {s.channels for s in samples}
            if len(algos) != 1 or len(protos) != 1:
                continue  # unknown, or NCCL switched within the bucket: leave the choice to NCCL
            algo, proto = PLUGIN_ALGORITHMS.get(algos.pop()), PLUGIN_PROTOCOLS.get(protos.pop())
            if algo is None or proto is None:
                continue
            channel = channels.pop() if len(channels) == 1 else None
            lines.append(
                ",".join(
                    [
                        PLUGIN_COLLECTIVES[proof.collective],
                        str(proof.bucket.min_bytes),
                        str(proof.bucket.max_bytes),
                        algo,
                        proto,
                        str(channel if channel is not None and channel > 0 else -1),
                        str(nodes),
                        str(ranks),
                        "-1",
                        "-1",
                    ]
                )
            )
    return "\n".join(lines) + "\n"
