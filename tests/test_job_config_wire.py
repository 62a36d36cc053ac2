"""A job's config survives the admin API's wire both ways: what the controller's ``ResolveJobConfig`` sends is
what ``env``, ``exec`` and ``hostfile`` read (``wire/job_configs.py``), every field, learning or not, with an
unknown bottleneck (0 on the wire) and a one-node job's (inf)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from topo_tune.ids import ConfigVersionId, NodeName, RolloutId
from topo_tune.jobs.config import LearningPin
from topo_tune.jobs.job_config import JobConfig
from topo_tune.learning.assignment import ArmIndex
from topo_tune.v1 import admin_pb2
from topo_tune.wire.job_configs import job_config_from_proto, job_config_to_proto

LEARNING = JobConfig(
    job_id="train-7",
    config_version=ConfigVersionId("cv-0123456789abcdef"),
    files=("nccl.conf", "nccl_tuner.conf", "nccl_tuner.1.conf"),
    nodes=(NodeName("gpu01"), NodeName("gpu02"), NodeName("gpu03")),
    rollout_id=RolloutId("ro-1"),
    node_order=(NodeName("gpu03"), NodeName("gpu01"), NodeName("gpu02")),
    master_addr="10.0.0.3",
    order_method="replanned",
    order_bottleneck_gbps=48.5,
    given_bottleneck_gbps=12.25,
    measured_edges=2,
    ring_edges=3,
    warnings=("gpu02: not in the version's pair matrix",),
    arm="stable",
    learning=LearningPin(ArmIndex(1), 16),
)


def test_every_field_is_on_the_wire_and_read_back_the_same() -> None:
    sent = job_config_to_proto(LEARNING)
    assert {f.name for f, _ in sent.ListFields()} == set(admin_pb2.JobConfig.DESCRIPTOR.fields_by_name), (
        "a field of the message that the domain value does not fill"
    )
    assert job_config_from_proto(sent) == LEARNING


@pytest.mark.parametrize(
    "config",
    [
        dataclasses.replace(LEARNING, learning=LearningPin(ArmIndex(0), 4)),
        dataclasses.replace(LEARNING, learning=None),
        dataclasses.replace(LEARNING, order_bottleneck_gbps=None, given_bottleneck_gbps=None, measured_edges=0),
        JobConfig("one-node", node_order=(NodeName("gpu01"),), order_bottleneck_gbps=math.inf),
        JobConfig(""),
    ],
    ids=["learning-the-chosen-table", "not-learning", "unknown-bottleneck", "one-node", "preview-on-defaults"],
)
def test_a_round_trip_gives_the_same_config(config: JobConfig) -> None:
    assert job_config_from_proto(job_config_to_proto(config)) == config


def test_a_job_that_does_not_learn_is_none_however_the_wire_fills_its_arm() -> None:
    # ``learning`` is what says the job learns: an arm or a sample beside a false one is not read as a pin.
    answer = admin_pb2.JobConfig(job_id="j", learning=False, learning_arm=3, timing_sample=8)
    assert job_config_from_proto(answer).learning is None
    learning = job_config_from_proto(admin_pb2.JobConfig(job_id="j", learning=True, learning_arm=0, timing_sample=8))
    assert learning.learning == LearningPin(ArmIndex(0), 8), "arm 0: the version's chosen table, still timed"
    assert job_config_from_proto(admin_pb2.JobConfig(order_bottleneck_gbps=0.0)).order_bottleneck_gbps is None
