"""The one list of benchmark backends (``nccl``, ``gloo``, ``sim``) and what each one can do.

cluster.yaml's ``backend``, ``topo-tune agent --backend``, the wire's ``Backend`` enum (a total mapping in
``wire/values.py``, checked at import) and the agent's executors all name a backend through :class:`Backend`;
every "does this backend ..." question is a property here, not a string compared at the caller. Non-goal: how a
backend runs (the workers in ``agent/bench/``, the model in ``agent/sim_backend.py``).
"""

from __future__ import annotations

import enum

__all__ = ["LAUNCHED_BACKENDS", "Backend"]


class Backend(enum.StrEnum):
    """Where an agent's collectives run: NCCL on GPUs, gloo on CPUs over TCP, or the analytic model."""

    NCCL = "nccl"
    GLOO = "gloo"
    SIM = "sim"

    @property
    def job_fixed_s(self) -> float | None:
        """A benchmark job's recorded fixed cost in seconds (start, delivery, commits; not the collectives), for
        estimating a pass: per spec where the backend runs workers, per job on sim; None where none is recorded.
        nccl: ``benchmarks/results/worker-reuse.md`` (a small ``init`` on one H200 with two ranks, kept and forked
        workers: 11.7 s over 24 specs; 3.2 s before them, ``h200-one-box.md``); gloo: ``benchmarks/results/demo.md``
        (the gloo quick start: 2.1 s over 10 specs); sim: ``demo.md`` (the demo's 237 s for about 1,400 jobs on
        two unloaded cores)."""
        return _JOB_FIXED_S.get(self)

    @property
    def simulated(self) -> bool:
        """Whether results come from the model (labelled simulated), not from collectives that ran."""
        return self is Backend.SIM

    @property
    def launches_workers(self) -> bool:
        """Whether the agent starts ``torch.distributed`` worker processes for it (``agent/bench/``)."""
        return self is not Backend.SIM

    @property
    def runs_nccl(self) -> bool:
        """Whether NCCL itself runs: GPUs, CUDA graphs, and the tuner plugin's table loaded by NCCL."""
        return self is Backend.NCCL

    @property
    def plays_nccl(self) -> bool:
        """Whether it stands for NCCL on GPUs (nccl, and sim's model of it): one rank per GPU, NCCL's own choices
        and the tuner plugin's table. gloo runs on CPUs and never loads NCCL or its plugin."""
        return self is not Backend.GLOO

    @property
    def runs_on_cpus(self) -> bool:
        """Whether it takes no GPU (gloo over TCP), so several stand-in nodes can share one machine."""
        return self is Backend.GLOO

    @property
    def one_way_probes(self) -> bool:
        """Whether a pair probe times a broadcast each direction (gloo has no concurrent send/recv), not sendrecv."""
        return self is Backend.GLOO


LAUNCHED_BACKENDS: tuple[Backend, ...] = tuple(b for b in Backend if b.launches_workers)
"""The backends the agent's benchmark executor runs with worker processes (the rest it simulates)."""


_JOB_FIXED_S = {Backend.NCCL: 0.49, Backend.GLOO: 0.21, Backend.SIM: 0.17}
