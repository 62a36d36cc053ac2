"""Outputs of a study: the files ``topo-tune init`` writes and the ConfigVersion built from them.

Purpose: from a :class:`~topo_tune.tuner.study.StudyOutcome`, write into one directory

* ``nccl.conf`` — the site-fixed settings plus, when a finalist was promoted, its tuned settings, exactly
  as NCCL reads them (``config_version.render_nccl_conf``); with "keep NCCL's defaults" only the site ones;
* ``nccl_tuner.conf`` — the tuner plugin's table (``docs/tuner-plugin.md``): when the promoted configuration
  is a table trial, exactly the table it was measured and proven with; otherwise, for each promoted
  (collective, bucket) of a collective the plugin handles, the algorithm/protocol/channels the proven
  configuration ran, when the benchmark reported them (the sim backend and NCCL's TUNING log do), unless
  the caller turns those derived rows off (``search.tunerTable: false``: only a proven table ships);
* ``hostfile`` (Open MPI's sequential mapper: one line per rank) and ``rankmap.json`` — the chosen rank order,
  with its ring predicted from the node-pair matrix next to NCCL's natural order (``rank_map``);
* ``topology.xml`` — when the caller has an ``NCCL_TOPO_FILE`` to ship;
* ``summary.json`` — baseline, best, per-bucket decisions with speedups, bounds and pairs, the decision rule,
  the trade-off (when one was found), trials, the simulated flag;
* ``report.html`` (``report``: one self-contained page, images inline) and its figures as PNGs under ``plots/``;
* ``nccl_tuner.challenger-N.conf`` — with learning on, the challenger tables the version carries beside its
  chosen table (``docs/learning.md``; the caller's ``carry`` picks them);
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topo_tune.errors import ConfigError
from topo_tune.security.safe_write import StagedFile, stage_file, write_file
from topo_tune.topology.distance import PairMatrix
from topo_tune.tuner.report.figure import ReportFigure
from topo_tune.tuner.report.page import render_report
from topo_tune.tuner.ring.model import ring_metrics
from topo_tune.tuner.ring.rank_map import RankMap, RingPrediction
from topo_tune.tuner.shipped_table import tuner_table
from topo_tune.tuner.space import NATURAL_ORDER
from topo_tune.tuner.study import StudyOutcome
from topo_tune.tuner.study_summary import TRADEOFF, summary
from topo_tune.tuner.timeout_advice import TimeoutAdvice
from topo_tune.tuner.workload_gain import WorkloadSource
from topo_tune.versions.version import (
    CHALLENGER_TABLES,
    NCCL_CONF,
    RANK_MAP,
    TOPO_FILE,
    TUNER_TABLE,
    ConfigVersion,
    render_nccl_conf,
)

__all__ = [
    "HOSTFILE",
    "REPORT",
    "SUMMARY",
    "ClusterShape",
    "WrittenOutputs",
    "rank_map",
    "write_outputs",
]

HOSTFILE = "hostfile"
SUMMARY = "summary.json"
CLUSTER_TIME = "cluster-time.json"
"""Wall time and node-seconds per phase: the one output that differs between two runs of a seeded sim study."""
REPORT = "report.html"
PLOTS = "plots"


@dataclass(frozen=True)
class ClusterShape:
    """The job shape the outputs are for: GPUs per node, and the node-pair matrix (probed or modelled)."""

    slots: Mapping[str, int]
    pairs: PairMatrix
    racks: Mapping[str, str] = field(default_factory=dict)  # node → rack, for the report's heatmap
    tiers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """node → the network tiers above its rack, top first: carried in the rank map for a job's re-planned ring."""

    @property
    def nodes(self) -> int:
        return len(self.slots)

    @property
    def ranks(self) -> int:
        return sum(self.slots.values())


Carry = Callable[[StudyOutcome, str], tuple[Mapping[str, str], Mapping[str, str]]]
"""(the outcome, the shipped ``nccl_tuner.conf``) -> the files and provenance a version carries besides its own."""


@dataclass(frozen=True)
class WrittenOutputs:
    directory: Path
    files: tuple[str, ...]
    config_version: ConfigVersion


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
        tiers={n: t for n, t in shape.tiers.items() if n in index and t},
    )


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
    workload: WorkloadSource | None = None,
    carry: Carry | None = None,
) -> WrittenOutputs:
    """Write every output into ``directory`` (created if needed) and return the ConfigVersion of the result.

    ``table_bucket_rows`` False: ``nccl_tuner.conf`` has rows only when the chosen configuration was measured
    with a table (no rows derived from promoted buckets, which never ran through the plugin). ``carry``: what
    else the version carries (learning's challenger tables), written beside the other files.
    """
    ranks = rank_map(outcome, shape)
    table = tuner_table(outcome, nodes=shape.nodes, ranks=shape.ranks, bucket_rows=table_bucket_rows)
    version = _config_version(
        outcome,
        ranks=ranks,
        table=table,
        topology_xml=topology_xml,
        nccl_version=nccl_version,
        topology_fingerprint=topology_fingerprint,
        carry=carry,
    )
    directory.mkdir(parents=True, exist_ok=True)
    summary_data = summary(
        outcome,
        nccl_version=nccl_version,
        topology_fingerprint=topology_fingerprint,
        config_version_id=version.id,
        advice=advice,
        workload=workload,
    )
    written = _result_files(version, table=table, ranks=ranks, summary_data=summary_data)
    written.update(_tradeoff_files(outcome, directory, shape=shape, table_bucket_rows=table_bucket_rows))
    figures = _figures(outcome, summary_data, shape) if plots else []
    report = render_report(
        summary_data,
        figures,
        outcome=outcome,
        files=[*written, *version.files],
        nodes=sorted(shape.slots),
        ranks=shape.ranks,
    )
    contents: dict[str, str | bytes] = {**written, **{f"{PLOTS}/{f.name}": f.png for f in figures}, REPORT: report}
    _replace_all(directory, contents)
    for name in set(CHALLENGER_TABLES) - set(contents):
        (directory / name).unlink(missing_ok=True)  # an earlier run's challenger is not this version's
    return WrittenOutputs(directory, tuple(sorted(contents)), version)


def _figures(outcome: StudyOutcome, summary_data: Mapping[str, Any], shape: ClusterShape) -> list[ReportFigure]:
    # Imported here: the drawing library costs a second of start-up to every process that imports this module
    # (the controller, for the studies it runs), while only writing the outputs draws.
    from topo_tune.tuner.report.figures import report_figures  # noqa: PLC0415

    return report_figures(outcome, summary_data, shape.pairs, shape.racks)


def _result_files(
    version: ConfigVersion, *, table: str, ranks: RankMap, summary_data: Mapping[str, Any]
) -> dict[str, str]:
    """The result's files by name: the version's (the tuner table even when empty), hostfile and summary."""
    return {
        **version.files,
        TUNER_TABLE: table,
        RANK_MAP: ranks.to_json(),
        HOSTFILE: ranks.hostfile("mpi"),
        SUMMARY: json.dumps(summary_data, indent=2) + "\n",
    }


def write_cluster_time(directory: Path, data: Mapping[str, Any]) -> Path:
    """``cluster-time.json`` beside the other outputs, written whole or not at all. Apart from summary.json, so
    the outputs that describe the result stay byte-identical between runs of a seeded study."""
    target = directory / CLUSTER_TIME
    write_file(target, json.dumps(data, indent=2) + "\n")
    return target


def _config_version(
    outcome: StudyOutcome,
    *,
    ranks: RankMap,
    table: str,
    topology_xml: str | None,
    nccl_version: str,
    topology_fingerprint: str,
    carry: Carry | None,
) -> ConfigVersion:
    """The result as a config version: its files carry nothing study-specific, the provenance travels beside;
    with ``carry``, a version with a tuner table carries what it adds (learning's challengers) beside."""
    order_name = outcome.chosen.config.rank_order.name if outcome.chosen is not None else NATURAL_ORDER
    env = dict(outcome.site_fixed)
    if outcome.chosen is not None:
        env.update(outcome.chosen.config.tuned_env(outcome.site_fixed))
    files: dict[str, str] = {NCCL_CONF: _nccl_conf(env)}
    if table.count("\n") > 1:
        files[TUNER_TABLE] = table
    if order_name != NATURAL_ORDER:
        files[RANK_MAP] = ranks.to_json()
    if topology_xml is not None:
        files[TOPO_FILE] = topology_xml
    carried: tuple[Mapping[str, str], Mapping[str, str]] = ({}, {})
    if carry is not None and TUNER_TABLE in files:
        carried = carry(outcome, table)
    return ConfigVersion(
        files={**files, **carried[0]},
        provenance={
            **carried[1],
            "study": outcome.name,
            "trials": str(len(outcome.trials)),
            "chosen_trial": str(outcome.chosen.trial) if outcome.chosen else "",
            "nccl_version": nccl_version,
            "topology_fingerprint": topology_fingerprint,
            "space_fingerprint": outcome.space_fingerprint,
            "simulated": "true" if outcome.simulated else "false",
        },
    )


def _tradeoff_files(
    outcome: StudyOutcome, directory: Path, *, shape: ClusterShape, table_bucket_rows: bool
) -> dict[str, str]:
    """The named trade-off's files under ``tradeoff/``; with none, an earlier run's are removed."""
    if outcome.tradeoff is None:
        stale = directory / TRADEOFF
        for name in (NCCL_CONF, TUNER_TABLE, RANK_MAP, HOSTFILE):
            (stale / name).unlink(missing_ok=True)  # an earlier run's alternative is not this run's
        with contextlib.suppress(OSError):
            stale.rmdir()
        return {}
    alternative = dataclasses.replace(outcome, chosen=outcome.tradeoff.proof)
    alt_env = dict(outcome.site_fixed)
    alt_env.update(outcome.tradeoff.proof.config.tuned_env(outcome.site_fixed))
    alt_ranks = rank_map(alternative, shape)
    (directory / TRADEOFF).mkdir(exist_ok=True)
    return {
        f"{TRADEOFF}/{NCCL_CONF}": _nccl_conf(alt_env),
        f"{TRADEOFF}/{TUNER_TABLE}": tuner_table(
            alternative, nodes=shape.nodes, ranks=shape.ranks, bucket_rows=table_bucket_rows
        ),
        f"{TRADEOFF}/{RANK_MAP}": alt_ranks.to_json(),
        f"{TRADEOFF}/{HOSTFILE}": alt_ranks.hostfile("mpi"),
    }


def _replace_all(directory: Path, contents: Mapping[str, str | bytes]) -> None:
    """Every file written beside its target first, then all renamed over the old ones: a run that fails while
    writing (a full disk, a kill) leaves the previous outputs whole, never a file cut short or a mix."""
    if any(name.startswith(f"{PLOTS}/") for name in contents):
        (directory / PLOTS).mkdir(exist_ok=True)
    staged: list[StagedFile] = []
    try:
        for name, content in contents.items():
            staged.append(stage_file(directory / name, content))
        for file in staged:
            file.commit()
    finally:
        for file in staged:
            file.discard()


NO_SETTINGS = "NCCL's defaults: no NCCL setting to change (no site setting, nothing tuned was promoted)"


def _nccl_conf(env: Mapping[str, str]) -> str:
    """The settings as NCCL reads them; with none, a comment saying so (NCCL reads it as no setting), never
    a 0-byte file that reads as a failed write."""
    return render_nccl_conf(env) if env else render_nccl_conf({}, header=NO_SETTINGS)
