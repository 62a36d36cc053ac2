"""Drift checks on the admin API's wire, both ways: the controller's servicers send them, the admin client reads
them back into the same domain type (``drift_record.DriftCheck``); and a check's plain form (``-o json``).

Non-goals: anything a check decides or stores (``controller/drift/``).
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

from topo_tune.drift_record import DriftCheck
from topo_tune.v1 import admin_pb2
from topo_tune.wire.plain_data import to_data
from topo_tune.wire.values import timestamp, timestamp_or_none


def drift_check_to_proto(check: DriftCheck) -> admin_pb2.DriftCheck:
    return admin_pb2.DriftCheck(
        check_id=check.check_id,
        kind=check.kind,
        status=check.status,
        message=check.message,
        config_version=check.config_version,
        rollout_id=check.rollout_id,
        wave=check.wave,
        nodes=list(check.nodes),
        reference_busbw_gbps=check.reference_busbw_gbps,
        measured_busbw_gbps=check.measured_busbw_gbps,
        threshold=check.threshold,
        job_ids=list(check.job_ids),
        study_id=check.study_id,
        simulated=check.simulated,
        created_at=timestamp(check.created_at),
        finished_at=timestamp_or_none(check.finished_at),
        p_value=check.p_value,
        alpha=check.alpha,
    )


def drift_check_from_proto(check: admin_pb2.DriftCheck) -> DriftCheck:
    return DriftCheck(
        check_id=check.check_id,
        kind=check.kind,
        status=check.status,
        message=check.message,
        config_version=check.config_version,
        rollout_id=check.rollout_id,
        nodes=tuple(check.nodes),
        job_ids=tuple(check.job_ids),
        study_id=check.study_id,
        simulated=check.simulated,
        created_at=check.created_at.ToDatetime(tzinfo=UTC),
        finished_at=check.finished_at.ToDatetime(tzinfo=UTC) if check.HasField("finished_at") else None,
        wave=check.wave if check.HasField("wave") else None,
        reference_busbw_gbps=check.reference_busbw_gbps if check.HasField("reference_busbw_gbps") else None,
        measured_busbw_gbps=check.measured_busbw_gbps if check.HasField("measured_busbw_gbps") else None,
        threshold=check.threshold if check.HasField("threshold") else None,
        p_value=check.p_value if check.HasField("p_value") else None,
        alpha=check.alpha if check.HasField("alpha") else None,
    )


def drift_check_data(check: DriftCheck) -> dict[str, Any]:
    """The check as ``-o json`` prints it: its message's plain form (``plain_data.py``)."""
    return to_data(drift_check_to_proto(check))
