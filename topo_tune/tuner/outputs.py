"""Outputs of a study: the files ``topo-tune init`` writes and the ConfigVersion built from them.

Purpose: from a :class:`~topo_tune.tuner.study.StudyOutcome`, write into one directory

* ``nccl.conf`` — the site-fixed settings plus, when a finalist was promoted, its tuned settings, exactly
  as NCCL reads them (``config_version.render_nccl_conf``); with "keep NCCL's defaults" only the site ones;
* ``nccl_tuner.conf`` — the tuner plugin's table (``docs/tuner-plugin.md``): when the promoted configuration
  is a table trial, exactly the table it was measured and proven with; otherwise, for each promoted
  (collective, bucket) of a collective the plugin handles, the algorithm/protocol/channels the proven
  configuration ran, when the benchmark reported them (the sim backend and NCCL's TUNING log do), unless
  the caller turns those derived rows off (``search.tunerTable: false``: only a proven table ships);
* ``hostfile`` (Open MPI, ``slots=``) and ``rankmap.json`` — the chosen rank order, with its ring predicted
  from the node-pair matrix next to NCCL's natural order (``rank_map``);
* ``topology.xml`` — when the caller has an ``NCCL_TOPO_FILE`` to ship;
* ``summary.json`` — baseline, best, per-bucket decisions with speedups, bounds and pairs, the decision rule,
  the trade-off (when one was found), trials, the simulated flag;
* ``report.html`` (``report``: one self-contained page, images inline) and its figures as PNGs under ``plots/``;
* ``tradeoff/`` — when the best finalist measured could not be chosen (some weighted bucket not shown safe),
  its ``nccl.conf``, ``nccl_tuner.conf``, ``hostfile`` and ``rankmap.json``: a non-default alternative a user
  may adopt knowingly, never the result and never part of the ConfigVersion.

File contents carry nothing study-specific beyond the settings, so the same settings give the same
ConfigVersion id; the provenance travels beside the files.

Non-goals: persisting anything, and rendering a topology file (the caller passes its text).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from topo_tune.config_version import NCCL_CONF, RANK_MAP, TOPO_FILE, TUNER_TABLE, ConfigVersion, render_nccl_conf
from topo_tune.errors import ConfigError
from topo_tune.topology.distance import PairMatrix
from topo_tune.tuner.objective import Measurements, Objective
from topo_tune.tuner.plugin_table import PLUGIN_COLLECTIVES
from topo_tune.tuner.proof import FinalistProof, Tradeoff
from topo_tune.tuner.rank_map import RankMap, RingPrediction
from topo_tune.tuner.report.figures import report_figures
from topo_tune.tuner.report.page import render_report
from topo_tune.tuner.ring import ring_metrics
from topo_tune.tuner.space import NATURAL_ORDER
from topo_tune.tuner.speedup_text import SEARCH_VS_PROOF, precise
from topo_tune.tuner.statistics import Decision
from topo_tune.tuner.study import StudyOutcome
from topo_tune.tuner.study_records import trial_counts
from topo_tune.tuner.timeout_advice import TimeoutAdvice
from topo_tune.tuner.workload_gain import WorkloadSource, workload_gain

__all__ = [
    "HOSTFILE",
    "REPORT",
    "SUMMARY",
    "TUNER_HEADER",
    "ClusterShape",
    "WrittenOutputs",
    "bucket_lines",
    "rank_map",
    "summary",
    "tuner_table",
    "verdict_lines",
    "write_outputs",
]

HOSTFILE = "hostfile"
SUMMARY = "summary.json"
REPORT = "report.html"
PLOTS = "plots"
TRADEOFF = "tradeoff"
SUMMARY_VERSION = 2

TUNER_HEADER = "collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff"
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
PLUGIN_PROTOCOLS = {"ll": "ll", "ll128": "ll128", "simple": "simple"}


@dataclass(frozen=True)
class ClusterShape:
    """The job shape the outputs are for: GPUs per node, and the node-pair matrix (probed or modelled)."""

    slots: Mapping[str, int]
    pairs: PairMatrix
    racks: Mapping[str, str] = field(default_factory=dict)  # node → rack, for the report's heatmap

    @property
    def nodes(self) -> int:
        return len(self.slots)

    @property
    def ranks(self) -> int:
        return sum(self.slots.values())


@dataclass(frozen=True)
class WrittenOutputs:
    directory: Path
    files: tuple[str, ...]
    config_version: ConfigVersion


def tuner_table(outcome: StudyOutcome, shape: ClusterShape, *, bucket_rows: bool = True) -> str:
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
                        str(shape.nodes),
                        str(shape.ranks),
                        "-1",
                        "-1",
                    ]
                )
            )
    return "\n".join(lines) + "\n"


def rank_map(outcome: StudyOutcome, shape: ClusterShape) -> RankMap:
    """The chosen order (NCCL's natural one when the defaults are kept) with its ring predicted from the
    pair matrix, next to the natural order's."""
    natural = outcome.natural_order
    order = outcome.chosen.config.rank_order if outcome.chosen is not None else natural
    missing = [n for n in order.nodes if n not in shape.slots or n not in shape.pairs.names]
    if missing:
        raise ConfigError("shape", f"no GPU count or pair-matrix row for node(s) {', '.join(missing)}")
    index = {n: i for i, n in enumerate(shape.pairs.names)}
    bandwidth, latency = shape.pairs.bandwidth(), shape.pairs.latency()

    def predict(nodes: Sequence[str]) -> RingPrediction:
        bottleneck, total = ring_metrics([index[n] for n in nodes], bandwidth, latency)
        return RingPrediction(tuple(nodes), bottleneck, total)

    return RankMap(
        planned=predict(order.nodes),
        naive=predict(natural.nodes),
        slots={n: shape.slots[n] for n in order.nodes},
        method=f"study order {order.name!r}",
        pairs=shape.pairs,
        racks={n: r for n, r in shape.racks.items() if n in index},
    )


def _bucket_rows(proof: FinalistProof | None) -> list[dict[str, object]]:
    if proof is None:
        return []
    return [
        {
            "collective": b.collective,
            "bucket": b.bucket.name,
            "min_bytes": b.bucket.min_bytes,
            "max_bytes": b.bucket.max_bytes,
            "scored_by": "time" if b.bucket.latency_bound else "busbw",
            "weight": b.weight,
            "decision": b.decision.value,
            "speedup": b.speedup,
            "ci_low": b.ci_low,
            "ci_high": b.ci_high,
            "speedup_text": b.text,
            "precise": precise(b.ci_low, b.ci_high),
            "confidence": b.comparison.confidence,
            "p_value": b.comparison.p_value,
            "p_value_min_effect": b.comparison.p_margin,
            "cv_baseline": b.comparison.cv_baseline,
            "cv_tuned": b.comparison.cv_candidate,
            "pairs": b.comparison.pairs,
            "decided_at_pairs": b.decided_at,
        }
        for b in proof.buckets
    ]


def _tradeoff(t: Tradeoff | None, outcome: StudyOutcome) -> dict[str, object] | None:
    if t is None:
        return None
    site = dict(outcome.site_fixed)
    return {
        "trial": t.proof.trial,
        "speedup": t.proof.speedup,
        "env": t.proof.config.tuned_env(site),
        "rank_order": t.proof.config.rank_order.name,
        "tuner_table": t.proof.config.tuner_table,
        "not_shown_safe": [{"collective": b.collective, "bucket": b.bucket.name} for b in t.unsafe],
        "accepted_by": t.accepts(),
        "accepted_by_max_loss": t.max_loss,
        "accepted_by_zero_buckets": list(t.zero_buckets),
        "files": TRADEOFF,
        "buckets": _bucket_rows(t.proof),
    }


def bucket_lines(proof: FinalistProof) -> list[str]:
    """One line per weighted bucket: its speedup and bounds (``BucketProof.text``), decision and pairs.

    A bucket decided at an earlier look keeps that look's point and bounds (``statistics.SequentialDesign``)
    while other buckets get more pairs, so the line says at how many pairs it was decided.
    """
    return [
        f"  {b.collective:<14} {b.bucket.name:<7} {b.text} {b.decision.value} "
        f"({_pairs(b.decided_at, b.comparison.pairs)})"
        for b in proof.weighted
    ]


def _pairs(decided_at: int, pairs: int) -> str:
    return f"{pairs} pairs" if decided_at >= pairs else f"decided at {decided_at} of {pairs} pairs"


def verdict_lines(outcome: StudyOutcome) -> list[str]:
    """What was decided, in words a user reads: the result, and the trade-off with what would accept it."""
    lines = []
    floor = f"lower bound >= {1 - outcome.max_loss:.3f}"
    if outcome.best is not None and outcome.best.value is not None:
        lines.append(f"search best: trial {outcome.best.number} at {outcome.best.value:.3f}x; {SEARCH_VS_PROOF}")
    if outcome.chosen is not None:
        lines.append(
            f"promoted trial {outcome.chosen.trial}: {outcome.chosen.text} the defaults (weighted); every "
            f"weighted bucket shown safe ({floor}) and one shown faster"
        )
        lines.extend(bucket_lines(outcome.chosen))
    else:
        lines.append(
            f"keep NCCL's defaults: no finalist was shown safe ({floor}) in every weighted bucket and faster in one"
        )
    t = outcome.tradeoff
    if t is not None:
        lines.append(
            f"trade-off (not the result): trial {t.proof.trial}, {t.proof.text} weighted, not shown safe in "
            + ", ".join(f"{b.collective} {b.bucket.name}" for b in t.unsafe)
        )
        lines.extend(bucket_lines(t.proof))
        lines.extend(f"  to accept it: {a}" for a in t.accepts())
        lines.append(f"  its files: {TRADEOFF}/")
    return lines


def _profile(m: Measurements | None) -> list[dict[str, object]]:
    if m is None:
        return []
    return [
        {"collective": s.collective, "bytes": s.bytes, "time_us": s.time_us, "busbw_gbs": s.busbw_gbs}
        for s in sorted(m.samples, key=lambda s: (s.collective, s.bytes))
    ]


def summary(
    outcome: StudyOutcome,
    *,
    nccl_version: str,
    topology_fingerprint: str,
    config_version_id: str,
    advice: TimeoutAdvice | None,
    objective: Objective | None = None,
    workload: WorkloadSource | None = None,
) -> dict[str, object]:
    """The machine-readable summary (``summary.json``). Each bucket row carries its workload weight (what the
    weighted speedup and its CI combine by) from the proof itself; ``objective`` adds nothing any more."""
    del objective
    chosen = outcome.chosen
    shown = chosen or max(outcome.proofs, key=lambda p: p.speedup, default=None)
    site = dict(outcome.site_fixed)
    best = outcome.best
    return {
        "version": SUMMARY_VERSION,
        "simulated": outcome.simulated,
        "study": {
            "name": outcome.name,
            "sampler": outcome.sampler,
            "seed": outcome.seed,
            "space_fingerprint": outcome.space_fingerprint,
        },
        "nccl_version": nccl_version,
        "topology_fingerprint": topology_fingerprint,
        "result": "promote" if chosen is not None else "keep NCCL's defaults",
        "config_version": config_version_id,
        "baseline": {
            "trial": outcome.baseline.number,
            "env": site,
            "rank_order": outcome.baseline.rank_order,
            "sizes": _profile(outcome.baseline.measurements),
        },
        "best": None
        if best is None
        else {
            "trial": best.number,
            "value": best.value,
            "env": {k: v for k, v in best.env.items() if k not in site},
            "rank_order": best.rank_order,
            "note": SEARCH_VS_PROOF,
        },
        "chosen": None
        if chosen is None
        else {
            "trial": chosen.trial,
            "speedup": chosen.speedup,
            "ci_low": None if chosen.interval is None else chosen.interval[0],
            "ci_high": None if chosen.interval is None else chosen.interval[1],
            "speedup_text": chosen.text,
            "env": chosen.config.tuned_env(site),
            "rank_order": chosen.config.rank_order.name,
            "node_order": list(chosen.config.rank_order.nodes),
            "tuner_table": chosen.config.tuner_table,
        },
        "proven_trial": None if shown is None else shown.trial,
        "decision_rule": {
            "safe": "one-sided lower bound of the speedup >= 1 - max_loss in every weighted bucket",
            "faster": "gain beyond min_effect significant, Holm-corrected over every bucket of the proof",
            "max_loss": outcome.max_loss,
            "min_effect": outcome.min_effect,
            "alpha": outcome.alpha,
        },
        "buckets": _bucket_rows(shown),
        "tradeoff": _tradeoff(outcome.tradeoff, outcome),
        "finalists": [
            {
                "trial": p.trial,
                "search_value": p.search_value,
                "proven_speedup": p.speedup,
                "speedup_text": p.text if p.buckets else None,
                # Several finalists may pass the rule; only the chosen one (the best of those) ships.
                "passed": p.promoted,
                "promoted": chosen is not None and p.trial == chosen.trial,
                "failure": p.failure,
                "tuner_table": p.config.tuner_table,
            }
            for p in outcome.proofs
        ],
        "trials": [
            {
                "number": t.number,
                "state": t.state,
                "role": t.role,
                "value": t.value,
                "env": {k: v for k, v in t.env.items() if k not in site},
                "rank_order": t.rank_order,
                "attempt": t.attempt,
                "superseded": t.superseded,
                "reason": t.reason,
                "tuner_table": t.tuner_table,
            }
            for t in outcome.trials
        ],
        "counts": trial_counts(outcome),
        "timeout_advice": None if advice is None else advice.to_json(),
        "workload": workload_gain(chosen, workload or WorkloadSource()),
    }


def write_outputs(
    outcome: StudyOutcome,
    directory: Path,
    *,
    shape: ClusterShape,
    nccl_version: str,
    topology_fingerprint: str,
    topology_xml: str | None = None,
    advice: TimeoutAdvice | None = None,
    plots: bool = True,
    table_bucket_rows: bool = True,
    objective: Objective | None = None,
    workload: WorkloadSource | None = None,
) -> WrittenOutputs:
    """Write every output into ``directory`` (created if needed) and return the ConfigVersion of the result.

    ``table_bucket_rows`` False: ``nccl_tuner.conf`` has rows only when the chosen configuration was measured
    with a table (no rows derived from promoted buckets, which never ran through the plugin).
    """
    ranks = rank_map(outcome, shape)
    order_name = outcome.chosen.config.rank_order.name if outcome.chosen is not None else NATURAL_ORDER
    env = dict(outcome.site_fixed)
    if outcome.chosen is not None:
        env.update(outcome.chosen.config.tuned_env(outcome.site_fixed))
    files: dict[str, str] = {NCCL_CONF: _nccl_conf(env)}
    table = tuner_table(outcome, shape, bucket_rows=table_bucket_rows)
    if table.count("\n") > 1:
        files[TUNER_TABLE] = table
    if order_name != NATURAL_ORDER:
        files[RANK_MAP] = ranks.to_json()
    if topology_xml is not None:
        files[TOPO_FILE] = topology_xml
    version = ConfigVersion(
        files=files,
        provenance={
            "study": outcome.name,
            "trials": str(len(outcome.trials)),
            "chosen_trial": str(outcome.chosen.trial) if outcome.chosen else "",
            "nccl_version": nccl_version,
            "topology_fingerprint": topology_fingerprint,
            "space_fingerprint": outcome.space_fingerprint,
            "simulated": "true" if outcome.simulated else "false",
        },
    )
    directory.mkdir(parents=True, exist_ok=True)
    summary_data = summary(
        outcome,
        nccl_version=nccl_version,
        topology_fingerprint=topology_fingerprint,
        config_version_id=version.id,
        advice=advice,
        objective=objective,
        workload=workload,
    )
    written = {
        NCCL_CONF: files[NCCL_CONF],
        TUNER_TABLE: table,
        RANK_MAP: ranks.to_json(),
        HOSTFILE: ranks.hostfile("mpi"),
        SUMMARY: json.dumps(summary_data, indent=2) + "\n",
    }
    if topology_xml is not None:
        written[TOPO_FILE] = topology_xml
    if outcome.tradeoff is not None:
        alternative = dataclasses.replace(outcome, chosen=outcome.tradeoff.proof)
        alt_env = dict(outcome.site_fixed)
        alt_env.update(outcome.tradeoff.proof.config.tuned_env(outcome.site_fixed))
        alt_ranks = rank_map(alternative, shape)
        written[f"{TRADEOFF}/{NCCL_CONF}"] = _nccl_conf(alt_env)
        written[f"{TRADEOFF}/{TUNER_TABLE}"] = tuner_table(alternative, shape, bucket_rows=table_bucket_rows)
        written[f"{TRADEOFF}/{RANK_MAP}"] = alt_ranks.to_json()
        written[f"{TRADEOFF}/{HOSTFILE}"] = alt_ranks.hostfile("mpi")
        (directory / TRADEOFF).mkdir(exist_ok=True)
    else:
        stale = directory / TRADEOFF
        for name in (NCCL_CONF, TUNER_TABLE, RANK_MAP, HOSTFILE):
            (stale / name).unlink(missing_ok=True)  # an earlier run's alternative is not this run's
        with contextlib.suppress(OSError):
            stale.rmdir()
    # Every file is written beside its target first, then all are renamed over the old ones: a run that fails
    # while writing (a full disk, a kill) leaves the previous outputs whole, never a file cut short or a mix.
    staged: list[tuple[Path, Path]] = []
    try:
        for name, text in written.items():
            staged.append(_stage(directory / name, text))
        figures = report_figures(outcome, summary_data, shape.pairs, shape.racks) if plots else []
        if figures:
            (directory / PLOTS).mkdir(exist_ok=True)
        images = [f.name for f in figures]
        for figure in figures:
            staged.append(_stage(directory / PLOTS / figure.name, figure.png))
        report = render_report(
            summary_data,
            figures,
            outcome=outcome,
            files=[*written, *files],
            nodes=sorted(shape.slots),
            ranks=shape.ranks,
        )
        staged.append(_stage(directory / REPORT, report))
        for partial, target in staged:
            os.replace(partial, target)
    finally:
        for partial, _ in staged:
            partial.unlink(missing_ok=True)
    names = sorted([*written, REPORT, *(f"{PLOTS}/{p}" for p in images)])
    return WrittenOutputs(directory, tuple(names), version)


NO_SETTINGS = "NCCL's defaults: no NCCL setting to change (no site setting, nothing tuned was promoted)"


def _nccl_conf(env: Mapping[str, str]) -> str:
    """The settings as NCCL reads them; with none, a comment saying so (NCCL reads it as no setting), never
    a 0-byte file that reads as a failed write."""
    return render_nccl_conf(env) if env else render_nccl_conf({}, header=NO_SETTINGS)


def _stage(target: Path, content: str | bytes) -> tuple[Path, Path]:
    """``content`` written completely to a scratch file beside ``target``; the caller renames it into place."""
    partial = target.with_name(f".{target.name}.partial")
    try:
        if isinstance(content, bytes):
            partial.write_bytes(content)
        else:
            partial.write_text(content)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return partial, target
