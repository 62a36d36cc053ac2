"""The one table of status codes: each exception class of the tree has the code its meaning calls for."""

from __future__ import annotations

import inspect

import grpc
import pytest

from topo_tune import errors
from topo_tune.controller.api.status_codes import code_for

C = grpc.StatusCode
EXPECTED: dict[type[errors.TopoTuneError], grpc.StatusCode] = {
    errors.TopoTuneError: C.FAILED_PRECONDITION,
    errors.FieldError: C.INVALID_ARGUMENT,
    errors.ConfigError: C.INVALID_ARGUMENT,
    errors.UnsafeKnobError: C.INVALID_ARGUMENT,
    errors.ValidationError: C.INVALID_ARGUMENT,
    errors.RequestRefused: C.INVALID_ARGUMENT,
    errors.SimInputError: C.INVALID_ARGUMENT,
    errors.SpecError: C.INVALID_ARGUMENT,
    errors.SweepError: C.INVALID_ARGUMENT,
    errors.EnvPolicyError: C.INVALID_ARGUMENT,
    errors.RecordError: C.INVALID_ARGUMENT,
    errors.TunerTableError: C.INVALID_ARGUMENT,
    errors.CpuListError: C.INVALID_ARGUMENT,
    errors.YamlLimitError: C.INVALID_ARGUMENT,
    errors.PathError: C.INVALID_ARGUMENT,
    errors.FileWriteError: C.FAILED_PRECONDITION,  # a file the controller writes (a study's outputs)
    errors.ClusterModelError: C.INVALID_ARGUMENT,
    errors.NcclXmlError: C.INVALID_ARGUMENT,
    errors.RingOrderError: C.INVALID_ARGUMENT,
    errors.WorkloadFileError: C.INVALID_ARGUMENT,
    errors.NotFoundError: C.NOT_FOUND,
    errors.PermissionDenied: C.PERMISSION_DENIED,
    errors.Unauthenticated: C.UNAUTHENTICATED,
    errors.ConflictError: C.FAILED_PRECONDITION,  # e.g. "node a is drained": the state, not the id, is wrong
    errors.AlreadyExists: C.ALREADY_EXISTS,
    errors.NodeBusy: C.ABORTED,
    errors.StoreBusy: C.ABORTED,
    errors.ConfigWriteError: C.FAILED_PRECONDITION,  # (agent) its node's disk: the state, not the request
    errors.LauncherBusy: C.ABORTED,
    errors.StudyCancelled: C.CANCELLED,
    errors.JobCancelled: C.CANCELLED,
    errors.StorageError: C.UNAVAILABLE,
    errors.ForkServerError: C.UNAVAILABLE,
    errors.DatabaseFull: C.RESOURCE_EXHAUSTED,  # a full disk stays full: retrying as for UNAVAILABLE cannot help
    errors.WatchEnded: C.UNAVAILABLE,
    errors.FencedError: C.UNAVAILABLE,
    errors.StaleTermError: C.UNAVAILABLE,
    errors.KubernetesError: C.UNAVAILABLE,
    errors.ControllerError: C.UNAVAILABLE,
    errors.UnsafeAnswer: C.UNAVAILABLE,  # raised by the client about an answer; never sent by a controller
    errors.ControllerUnavailable: C.UNAVAILABLE,
    errors.ControllerDatabaseUnavailable: C.UNAVAILABLE,
    errors.ControllerDatabaseFull: C.UNAVAILABLE,
    errors.PluginBuildError: C.FAILED_PRECONDITION,
    errors.SessionRefused: C.FAILED_PRECONDITION,
    errors.AgentRefused: C.FAILED_PRECONDITION,  # (agent) ends the agent: never sent as a status
    errors.NvmlCallError: C.FAILED_PRECONDITION,
    errors.TrialFailed: C.FAILED_PRECONDITION,
    errors.StudyError: C.FAILED_PRECONDITION,
    errors.PassError: C.FAILED_PRECONDITION,
    errors.MetricNotFound: C.FAILED_PRECONDITION,
    errors.ExpertModeRequired: C.FAILED_PRECONDITION,
    errors.QuotaExceeded: C.RESOURCE_EXHAUSTED,
}


def test_the_table_decides_every_class_of_the_tree() -> None:
    tree = {c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.TopoTuneError)}
    assert tree == set(EXPECTED)


@pytest.mark.parametrize("kind", list(EXPECTED), ids=lambda kind: kind.__name__)
def test_each_class_has_its_code(kind: type[errors.TopoTuneError]) -> None:
    assert code_for(kind.__new__(kind)) == EXPECTED[kind]
