"""Jobs' own A/B comparisons on the admin API's wire: a node's record (header and runs) as a request, and a
``StoredComparison`` ↔ its message, both ways; and a comparison's plain form (``-o json``, the report).

``exec --compare`` sends a record and reads the comparison back; the controller's servicers send comparisons
through ``job_comparison_to_proto`` and check a record field by field at their edge (``controller/api/messages.py``).
Non-goals: validating a record, gRPC.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC
from typing import Any, TypeVar

from topo_tune.errors import ControllerError
from topo_tune.jobs.compare.comparison_record import ComparisonHeader, StoredComparison
from topo_tune.jobs.compare.schedule import Arm
from topo_tune.jobs.compare.summary import ComparisonSummary, RunValue
from topo_tune.tuner.statistics import Decision
from topo_tune.v1 import admin_pb2
from topo_tune.wire.plain_data import to_data
from topo_tune.wire.values import instant_or_none, timestamp, timestamp_or_none

T = TypeVar("T")

_ARMS = {arm.value: arm for arm in Arm}
_DECISIONS = {decision.value: decision for decision in Decision}


def job_comparison_request_to_proto(
    header: ComparisonHeader, runs: Sequence[RunValue]
) -> admin_pb2.RecordJobComparisonRequest:
    return admin_pb2.RecordJobComparisonRequest(
        job_id=header.job_id,
        candidate=header.candidate,
        candidate_version=header.candidate_version,
        against=header.against,
        against_version=header.against_version,
        metric=header.metric,
        higher_is_better=header.higher_is_better,
        pairs=header.pairs,
        nodes=list(header.nodes),
        candidate_order=list(header.candidate_order),
        against_order=list(header.against_order),
        runs=[
            admin_pb2.JobComparisonRun(index=r.index, pair=r.pair, arm=r.arm.value, value=r.value, node=r.node)
            for r in runs
        ],
    )


def job_comparison_to_proto(stored: StoredComparison) -> admin_pb2.JobComparison:
    message = admin_pb2.JobComparison(
        comparison_id=stored.id,
        job=job_comparison_request_to_proto(stored.header, stored.runs),
        complete=stored.complete,
        created_at=timestamp(stored.created_at),
        completed_at=timestamp_or_none(stored.completed_at),
    )
    figures = stored.figures
    if figures is not None:
        message.candidate_median = figures.candidate_median
        message.against_median = figures.against_median
        message.gain = figures.gain
        message.ci_low = figures.ci_low
        message.ci_high = figures.ci_high
        message.confidence = figures.confidence
        message.p_value = figures.p_value
        message.decision = figures.decision.value
    return message


def _answered(table: Mapping[str, T], value: str, *, what: str, comparison_id: str) -> T:
    """``table[value]``, or a ``ControllerError`` naming a word this version does not know (a newer controller)."""
    if value not in table:
        raise ControllerError(f"job comparison {comparison_id}: the controller answered an unknown {what} {value!r}")
    return table[value]


def job_comparison_from_proto(message: admin_pb2.JobComparison) -> StoredComparison:
    job = message.job
    header = ComparisonHeader(
        job_id=job.job_id,
        candidate=job.candidate,
        candidate_version=job.candidate_version,
        against=job.against,
        against_version=job.against_version,
        metric=job.metric,
        higher_is_better=job.higher_is_better,
        pairs=job.pairs,
        nodes=tuple(job.nodes),
        candidate_order=tuple(job.candidate_order),
        against_order=tuple(job.against_order),
    )
    key = message.comparison_id
    runs = tuple(
        RunValue(
            index=r.index,
            pair=r.pair,
            arm=_answered(_ARMS, r.arm, what="arm", comparison_id=key),
            value=r.value,
            node=r.node,
        )
        for r in job.runs
    )
    figures = None
    if message.complete:
        figures = ComparisonSummary(
            pairs=job.pairs,
            candidate_median=message.candidate_median,
            against_median=message.against_median,
            gain=message.gain,
            ci_low=message.ci_low,
            ci_high=message.ci_high,
            confidence=message.confidence,
            p_value=message.p_value,
            decision=_answered(_DECISIONS, message.decision, what="decision", comparison_id=key),
            higher_is_better=job.higher_is_better,
        )
    return StoredComparison(
        id=key,
        header=header,
        runs=runs,
        figures=figures,
        created_at=message.created_at.ToDatetime(UTC),
        completed_at=instant_or_none(message, "completed_at"),
    )


def job_comparison_data(stored: StoredComparison) -> dict[str, Any]:
    """The comparison as ``-o json`` prints it and the report reads it: its message's plain form."""
    return to_data(job_comparison_to_proto(stored))
