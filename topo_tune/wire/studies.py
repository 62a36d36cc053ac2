"""Controller-run studies on the admin API's wire, both ways: the controller's servicers read requests and send
studies and trials; the admin client sends requests and reads the same domain types back (``study_record``).
Also a study's plain form (``-o json``). Non-goals: running a study (the controller's ``studies.py``).
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

from topo_tune.errors import ControllerError
from topo_tune.ids import StudyId
from topo_tune.study_record import Study, StudyRequest, StudyStatus, StudyTrial, StudyTrials
from topo_tune.v1 import admin_pb2
from topo_tune.wire.plain_data import to_data
from topo_tune.wire.values import timestamp, timestamp_or_none

STUDY_STATUS_TO_WIRE = {
    StudyStatus.RUNNING: admin_pb2.STUDY_STATUS_RUNNING,
    StudyStatus.SUCCEEDED: admin_pb2.STUDY_STATUS_SUCCEEDED,
    StudyStatus.FAILED: admin_pb2.STUDY_STATUS_FAILED,
    StudyStatus.CANCELLED: admin_pb2.STUDY_STATUS_CANCELLED,
}


def from_proto_study_request(request: admin_pb2.StartStudyRequest) -> StudyRequest:
    return StudyRequest(
        study_id=request.study_id,
        nodes=tuple(request.nodes),
        collectives=dict(request.collectives),
        budget=request.budget,
        sampler=request.sampler,
        seed=request.seed,
        min_bytes=request.min_bytes,
        max_bytes=request.max_bytes,
        step_factor=request.step_factor,
        site_fixed=dict(request.site_fixed),
        knobs=tuple(request.knobs),
        finalists=request.finalists,
        proof_pairs=request.proof_pairs,
        cuda_graph=request.cuda_graph if request.HasField("cuda_graph") else None,
        no_tuner_table=request.no_tuner_table,
    )


def to_proto_study(study: Study) -> admin_pb2.StudyInfo:
    return admin_pb2.StudyInfo(
        study_id=study.study_id,
        status=STUDY_STATUS_TO_WIRE[study.status],
        message=study.message,
        phase=study.phase,
        done=study.done,
        total=study.total,
        best_value=study.best_value,
        config_version=study.config_version,
        result=study.result,
        nodes=list(study.nodes),
        simulated=study.simulated,
        created_at=timestamp(study.created_at),
        finished_at=timestamp_or_none(study.finished_at),
    )


def to_proto_study_trial(t: StudyTrial) -> admin_pb2.StudyTrial:
    return admin_pb2.StudyTrial(number=t.number, state=t.state, reason=t.reason, env=dict(t.env), value=t.value)


def to_proto_study_trials(trials: StudyTrials) -> admin_pb2.StudyTrials:
    trial_list = [to_proto_study_trial(t) for t in trials.trials]
    return admin_pb2.StudyTrials(study_id=trials.study_id, trials=trial_list, best_trial=trials.best_trial)


STUDY_STATUS_FROM_WIRE = {wire: status for status, wire in STUDY_STATUS_TO_WIRE.items()}


def to_proto_study_request(request: StudyRequest) -> admin_pb2.StartStudyRequest:
    return admin_pb2.StartStudyRequest(
        study_id=request.study_id,
        nodes=list(request.nodes),
        collectives=dict(request.collectives),
        budget=request.budget,
        sampler=request.sampler,
        seed=request.seed,
        min_bytes=request.min_bytes,
        max_bytes=request.max_bytes,
        step_factor=request.step_factor,
        site_fixed=dict(request.site_fixed),
        knobs=list(request.knobs),
        finalists=request.finalists,
        proof_pairs=request.proof_pairs,
        cuda_graph=request.cuda_graph,
        no_tuner_table=request.no_tuner_table,
    )


def from_proto_study(info: admin_pb2.StudyInfo) -> Study:
    status = STUDY_STATUS_FROM_WIRE.get(info.status)
    if status is None:
        raise ControllerError(f"study {info.study_id}: the controller answered an unknown status ({info.status})")
    return Study(
        study_id=StudyId(info.study_id),
        status=status,
        message=info.message,
        nodes=tuple(info.nodes),
        simulated=info.simulated,
        created_at=info.created_at.ToDatetime(tzinfo=UTC),
        finished_at=info.finished_at.ToDatetime(tzinfo=UTC) if info.HasField("finished_at") else None,
        config_version=info.config_version,
        result=info.result,
        phase=info.phase,
        done=info.done,
        total=info.total,
        best_value=info.best_value if info.HasField("best_value") else None,
    )


def from_proto_study_trials(trials: admin_pb2.StudyTrials) -> StudyTrials:
    return StudyTrials(
        study_id=StudyId(trials.study_id),
        trials=tuple(
            StudyTrial(
                number=t.number,
                state=t.state,
                reason=t.reason,
                env=dict(t.env),
                value=t.value if t.HasField("value") else None,
            )
            for t in trials.trials
        ),
        best_trial=trials.best_trial if trials.HasField("best_trial") else None,
    )


def study_data(study: Study) -> dict[str, Any]:
    """The study as ``-o json`` prints it: its message's plain form (``plain_data.py``)."""
    return to_data(to_proto_study(study))


def study_trials_data(trials: StudyTrials) -> dict[str, Any]:
    return to_data(to_proto_study_trials(trials))


def study_trial_data(trial: StudyTrial) -> dict[str, Any]:
    return to_data(to_proto_study_trial(trial))
