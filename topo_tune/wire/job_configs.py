"""A job's config on the admin API's wire, both ways: the controller's ``ResolveJobConfig`` sends it, the admin
client reads it back into the same domain value (``jobs.job_config.JobConfig``).

On the wire an unknown bottleneck is 0 and a job that does not learn has ``learning`` false (its arm and
sample 0); the domain value says None for both. Non-goals: checking the names in an answer
(``client/job_answer.py``), resolving a job (``controller/rollout/job_pins.py``).
"""

from __future__ import annotations

from topo_tune.ids import ConfigVersionId, NodeName, RolloutId
from topo_tune.jobs.config import LearningPin
from topo_tune.jobs.job_config import JobConfig
from topo_tune.learning.assignment import ArmIndex
from topo_tune.v1 import admin_pb2


def job_config_to_proto(config: JobConfig) -> admin_pb2.JobConfig:
    learning = config.learning
    return admin_pb2.JobConfig(
        job_id=config.job_id,
        config_version=config.config_version,
        files=list(config.files),
        nodes=list(config.nodes),
        rollout_id=config.rollout_id,
        node_order=list(config.node_order),
        master_addr=config.master_addr,
        order_method=config.order_method,
        order_bottleneck_gbps=config.order_bottleneck_gbps or 0.0,
        given_bottleneck_gbps=config.given_bottleneck_gbps or 0.0,
        warnings=list(config.warnings),
        arm=config.arm,
        measured_edges=config.measured_edges,
        ring_edges=config.ring_edges,
        learning=learning is not None,
        learning_arm=0 if learning is None else learning.arm,
        timing_sample=0 if learning is None else learning.timing_sample,
    )


def job_config_from_proto(config: admin_pb2.JobConfig) -> JobConfig:
    return JobConfig(
        job_id=config.job_id,
        config_version=ConfigVersionId(config.config_version),
        files=tuple(config.files),
        nodes=tuple(NodeName(n) for n in config.nodes),
        rollout_id=RolloutId(config.rollout_id),
        node_order=tuple(NodeName(n) for n in config.node_order),
        master_addr=config.master_addr,
        order_method=config.order_method,
        order_bottleneck_gbps=config.order_bottleneck_gbps or None,
        given_bottleneck_gbps=config.given_bottleneck_gbps or None,
        measured_edges=config.measured_edges,
        ring_edges=config.ring_edges,
        warnings=tuple(config.warnings),
        arm=config.arm,
        learning=LearningPin(ArmIndex(config.learning_arm), config.timing_sample) if config.learning else None,
    )
