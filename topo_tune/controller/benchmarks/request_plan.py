"""A benchmark request planned into its job's specs: the checks that need no node, and each spec's rank map.

``ValidationError`` names the request's field (``next_specs[2].nodes`` for a further spec's). Non-goals: the
nodes' readiness and busyness, storing and sending the job (``service.py``), the rank arithmetic (``plan.py``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.job_record import BenchmarkRequest
from topo_tune.benchmark.job_spec import MAX_DEADLINE_S, MAX_SPECS, BenchmarkSpec
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.controller.benchmarks.plan import JobNode, plan_job
from topo_tune.controller.nodes import NodeView
from topo_tune.errors import SpecError, SweepError, ValidationError
from topo_tune.nccl.backends import Backend
from topo_tune.nccl.collectives import Collective

_FIELD_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*|\[\d+\])*")


def planned(
    request: BenchmarkRequest,
    *,
    job_id: str,
    collective: Collective,
    nodes: list[JobNode],
    backend: Backend,
    port: int,
) -> BenchmarkSpec:
    """The request's (first) spec on ``nodes``, in their order."""
    try:
        return plan_job(
            job_id=job_id,
            collective=collective,
            sweep=SizeSweep(
                min_bytes=request.sizes.min_bytes,
                max_bytes=request.sizes.max_bytes,
                step_factor=request.sizes.step_factor or 2,
            ),
            dtype=dtype_named(request.dtype or "float32"),
            nodes=nodes,
            rendezvous_port=port,
            env=dict(request.env),
            gpu_devices=backend.runs_nccl,
            ranks_per_node=request.ranks_per_node or None,
            warmup_iters=request.warmup_iters or 5,
            iters=request.iters or 20,
            placements=(False, True) if request.both_placements else (False,),
            tuner_table=request.tuner_table,
            cuda_graph=request.cuda_graph,
        )
    except (SpecError, SweepError) as error:
        # Their messages start with the field ("sizes.max_bytes (8) is below ..."), or with a field and its
        # value ("ranks_per_node=9 but ..."): the whole message then, under no field.
        field_name, _, reason = str(error).partition(" ")
        if not _FIELD_PATH.fullmatch(field_name):
            field_name, reason = "", str(error)
        raise ValidationError(field_name, reason) from None
    except ValueError as error:
        raise ValidationError("", str(error)) from None


def next_specs(
    request: BenchmarkRequest, *, job_id: str, nodes: list[JobNode], backend: Backend, port: Callable[[], int]
) -> tuple[BenchmarkSpec, ...]:
    """The job's further specs, each planned as a job of its own on the same nodes (its own rendezvous
    port: a node may start a spec while another still runs the one before)."""
    if len(request.next_specs) >= MAX_SPECS:
        raise ValidationError("next_specs", f"at most {MAX_SPECS - 1}, got {len(request.next_specs)}")
    by_name = {node.name: node for node in nodes}
    specs: list[BenchmarkSpec] = []
    for i, more in enumerate(request.next_specs):
        where = f"next_specs[{i}]"
        if more.collective is None:
            raise ValidationError(f"{where}.collective", f"one of {', '.join(c.value for c in Collective)} is required")
        if sorted(more.nodes) != sorted(by_name):
            raise ValidationError(f"{where}.nodes", "must list the job's nodes, each once (in any order)")
        one = dataclasses.replace(
            request, nodes=more.nodes, sizes=more.sizes, env=more.env, tuner_table=more.tuner_table, next_specs=()
        )
        try:
            spec = planned(
                one,
                job_id=job_id,
                collective=more.collective,
                nodes=[by_name[name] for name in more.nodes],
                backend=backend,
                port=port(),
            )
        except ValidationError as error:
            raise ValidationError(f"{where}.{error.field}" if error.field else where, error.reason) from None
        specs.append(spec)
    return tuple(specs)


def checked_request(request: BenchmarkRequest) -> Collective:
    """The request's collective, after the checks that need no node: ``ValidationError`` naming the field."""
    if request.collective is None:
        raise ValidationError("collective", f"one of {', '.join(c.value for c in Collective)} is required")
    if not request.nodes:
        raise ValidationError("nodes", "at least one node is required")
    if len(set(request.nodes)) != len(request.nodes):
        raise ValidationError("nodes", "a node is listed twice")
    if request.deadline_s > MAX_DEADLINE_S:
        raise ValidationError("deadline_s", f"at most {MAX_DEADLINE_S}")
    return request.collective


def one_backend(views: list[NodeView], *, cuda_graph: bool) -> Backend:
    """The one backend every node of the job runs; ``ValidationError`` when they differ or cannot time graphs."""
    backends = {v.backend for v in views}
    if len(backends) != 1:
        raise ValidationError("nodes", f"the nodes run different backends ({', '.join(sorted(backends))})")
    backend = backends.pop()
    if cuda_graph and not backend.runs_nccl:
        raise ValidationError("cuda_graph", f"CUDA graphs need the nccl backend; the nodes run {backend}")
    return backend
