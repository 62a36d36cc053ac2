"""``topo-tune exec --compare``: the job's own A/B, started on every node of the job by the user's launcher.

Each node runs the job's command ``2 × pairs`` times, in the order ``job_compare.schedule`` derives from the
job id alone, so every node runs the same arm at the same time without talking to the others; the command
itself (torchrun's rendezvous, an MPI job's start-up) holds the nodes together run by run. Each run gets its
arm's whole environment: the NCCL files of the arm's version and the arm's node order (this node's
``TOPO_TUNE_NODE_RANK`` among them), so a run measures settings *and* order, as a version is both.

Before the first run, every node checks that both arms' versions are staged here and intact, and that it
is one of the job's nodes: a node that cannot run an arm fails at once, with the reason, instead of hanging
the others in the middle of the comparison. A run that exits non-zero ends the comparison with its status.

The metric of a run is read on the node that is node rank 0 of that run's arm (where a training script
prints its step time). The two arms' orders may put different nodes first, so each node that read values
records them at the controller (``RecordJobComparison``, allowed to a job credential); the controller
computes the figures once every run is in, and the node whose record completes the comparison (or that sees
it complete within ``--record-wait``) prints them.

Non-goals: starting processes on other nodes (the user's launcher does), the statistics (``job_compare``).
"""

from __future__ import annotations

import logging
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

import click

from topo_tune.cli.job_comparisons import verdict_lines
from topo_tune.cli.output import emit_line
from topo_tune.client.admin import AdminClient
from topo_tune.errors import ConfigError, MetricNotFound, TopoTuneError
from topo_tune.jobs.compare.comparison_record import ComparisonHeader
from topo_tune.jobs.compare.metric import MetricReader, compile_metric
from topo_tune.jobs.compare.schedule import Arm, Run, arm_schedule
from topo_tune.jobs.compare.summary import RunValue

logger = logging.getLogger(__name__)

ARM_VARIABLE = "TOPO_TUNE_COMPARE_ARM"
"""Set for each run: ``candidate`` or ``against``."""
RUN_VARIABLE = "TOPO_TUNE_COMPARE_RUN"
"""Set for each run: its 0-based place in the schedule (e.g. to pick a fresh rendezvous port per run)."""


@dataclass(frozen=True)
class ArmConfig:
    """One arm as this node runs it."""

    name: str
    """As the user named it: a version id, ``stable`` or ``defaults``."""
    version: str
    """The version it resolved to; "" for NCCL's defaults."""
    order: tuple[str, ...]
    """The job's nodes in node-rank order under this arm."""
    variables: Mapping[str, str]
    """Every variable a run of this arm gets (NCCL files, TOPO_TUNE_NODE_RANK and the rest)."""


ArmResolver = Callable[[str], ArmConfig]
"""An arm's name → its config for this job on this node; raises (with the reason) when it cannot run here."""


@dataclass(frozen=True)
class CompareSpec:
    """What ``--compare`` and its options ask for."""

    candidate: str
    against: str
    pairs: int
    metric: str
    higher_is_better: bool
    record_wait_s: float


def compare_options(function: Any) -> Any:
    """The ``exec --compare`` options, added to ``exec``."""
    function = click.option(
        "--record-wait",
        type=click.FloatRange(min=0),
        default=120.0,
        show_default=True,
        metavar="SECONDS",
        help="With --compare: how long a node waits for the other nodes' values before printing the figures.",
    )(function)
    function = click.option(
        "--higher-is-better",
        is_flag=True,
        help="With --compare: the metric is a throughput (higher is better); default: a time (lower is better).",
    )(function)
    function = click.option(
        "--metric",
        default="",
        metavar="REGEX",
        help="With --compare: group 1 of the last match in node rank 0's output is a run's value, e.g. "
        "'step_time=([0-9.]+)'.",
    )(function)
    function = click.option(
        "--pairs",
        type=int,
        default=5,
        show_default=True,
        help="With --compare: runs of each arm; COMMAND runs 2 x PAIRS times.",
    )(function)
    function = click.option(
        "--against",
        default="",
        metavar="ARM",
        help="With --compare: the arm to beat: stable, defaults (NCCL's, the launcher's order) or a version id.",
    )(function)
    return click.option(
        "--compare",
        "candidate",
        default="",
        metavar="VERSION",
        help="Run the job's own A/B: COMMAND under VERSION (a version id or stable) against --against, "
        "interleaved; prints and records the gain. Every node of the job runs the same exec --compare.",
    )(function)


def spec_from_options(
    *, candidate: str, against: str, pairs: int, metric: str, higher_is_better: bool, record_wait: float
) -> CompareSpec:
    """The options checked at the edge (a bad regex or arm fails before anything is resolved)."""
    if not against:
        raise ConfigError("--against", "name the arm to beat: stable, defaults or a version id")
    compile_metric(metric)
    if against == candidate:
        raise ConfigError("--against", f"compares {candidate!r} with itself")
    if candidate == "defaults":
        raise ConfigError("--compare", "name the version to try (a version id or stable); defaults goes in --against")
    return CompareSpec(candidate, against, pairs, metric, higher_is_better, record_wait)


def _label(run: Run, total: int, arm: ArmConfig) -> str:
    return f"run {run.index + 1}/{total} (pair {run.pair + 1}, {run.arm.value} {arm.name})"


def _pump(stream: IO[str], sink: IO[str], reader: MetricReader, lock: threading.Lock) -> None:
    for line in stream:
        sink.write(line)
        sink.flush()
        with lock:
            reader.feed(line)


def run_command(argv: Sequence[str], env: Mapping[str, str], reader: MetricReader | None) -> int:
    """Run ``argv`` once; its output passes through, and is fed to ``reader`` line by line when one is given.

    The terminal's Ctrl-C reaches the command too (one process group): ``exec`` lets it finish, then ends the
    comparison there (the command's status, or killed by SIGINT when it exited 0). The interrupt is noted, not
    raised, from before the command starts, so that it cannot land between two steps of starting its output's
    pumps (a busy machine stretches those) and end ``exec`` with a traceback."""
    sys.stdout.flush()
    piped = subprocess.PIPE if reader is not None else None
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda _number, _frame: interrupted.set())
    try:
        status = _run_and_wait(argv, env, reader, piped)
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted.is_set():
        return status or -signal.SIGINT
    return status


def _run_and_wait(argv: Sequence[str], env: Mapping[str, str], reader: MetricReader | None, piped: int | None) -> int:
    try:
        process = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdout=piped,
            stderr=piped,
            text=True,
            errors="replace",
            close_fds=False,  # the jobs.lock descriptor stays with the command, as under plain exec
        )
    except OSError as error:
        raise click.ClickException(f"cannot run {argv[0]!r}: {error.strerror}") from None
    pumps = []
    if reader is not None:
        assert process.stdout is not None and process.stderr is not None
        lock = threading.Lock()
        pumps = [
            threading.Thread(target=_pump, args=(process.stdout, sys.stdout, reader, lock), daemon=True),
            threading.Thread(target=_pump, args=(process.stderr, sys.stderr, reader, lock), daemon=True),
        ]
    for pump in pumps:
        pump.start()
    status = process.wait()
    for pump in pumps:
        pump.join()
    return status


def _exit_status(returncode: int) -> int:
    """A shell's convention: a command killed by signal N ends with 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _note(text: str) -> None:
    emit_line(f"topo-tune: {text}", err=True)


def run_comparison(
    client: AdminClient,
    *,
    spec: CompareSpec,
    job_id: str,
    nodes: Sequence[str],
    node: str,
    resolve: ArmResolver,
    command: Sequence[str],
    environ: Mapping[str, str],
) -> int:
    """Run the whole comparison on this node; the exit status ``exec`` ends with."""
    pattern = compile_metric(spec.metric)
    schedule = arm_schedule(job_id, spec.pairs)
    arms: dict[Arm, ArmConfig] = {}
    for side, name in ((Arm.CANDIDATE, spec.candidate), (Arm.AGAINST, spec.against)):
        try:
            arms[side] = resolve(name)
        except TopoTuneError as error:
            raise click.ClickException(f"{side.value} arm {name}: {error}; no run started on {node}") from None
        if node not in arms[side].order:
            raise click.ClickException(
                f"this node ({node}) is not one of the job's nodes ({', '.join(arms[side].order)}): name it as "
                "its agent does (--node NAME or $TOPO_TUNE_NODE_NAME)"
            )
    _note(
        f"comparing {spec.candidate} with {spec.against} on {node}: {len(schedule)} runs, "
        f"order {''.join('A' if r.arm is Arm.CANDIDATE else 'B' for r in schedule)} (A = {spec.candidate})"
    )
    values: list[RunValue] = []
    for run in schedule:
        arm = arms[run.arm]
        rank = arm.order.index(node)
        label = _label(run, len(schedule), arm)
        _note(f"{label}: node rank {rank} of {len(arm.order)}")
        reader = MetricReader(pattern) if rank == 0 else None
        env = {
            **environ,
            **arm.variables,
            "TOPO_TUNE_NODE_RANK": str(rank),
            ARM_VARIABLE: run.arm.value,
            RUN_VARIABLE: str(run.index),
        }
        returncode = run_command(command, env, reader)
        if returncode != 0:
            _note(f"{label} exited with status {_exit_status(returncode)}; the comparison ends")
            return _exit_status(returncode)
        if reader is not None:
            try:
                value = reader.value(label)
            except MetricNotFound as error:
                raise click.ClickException(str(error)) from None
            values.append(RunValue(index=run.index, pair=run.pair, arm=run.arm, value=value, node=node))
    if values:
        _record(client, spec, job_id=job_id, nodes=nodes, arms=arms, values=values)
    else:
        _note(f"{node} was node rank 0 of no run: the nodes that were record the values")
    return 0


def _record(
    client: AdminClient,
    spec: CompareSpec,
    *,
    job_id: str,
    nodes: Sequence[str],
    arms: Mapping[Arm, ArmConfig],
    values: list[RunValue],
) -> None:
    header = ComparisonHeader(
        job_id=job_id,
        candidate=spec.candidate,
        candidate_version=arms[Arm.CANDIDATE].version,
        against=spec.against,
        against_version=arms[Arm.AGAINST].version,
        metric=spec.metric,
        higher_is_better=spec.higher_is_better,
        pairs=spec.pairs,
        nodes=tuple(sorted(set(nodes))),
        candidate_order=tuple(arms[Arm.CANDIDATE].order),
        against_order=tuple(arms[Arm.AGAINST].order),
    )
    deadline = time.monotonic() + spec.record_wait_s
    stored = client.record_job_comparison(header, values)
    # Recording the same runs again is a no-op that answers with the comparison as it stands now.
    while not stored.complete and time.monotonic() < deadline:
        time.sleep(1.0)
        stored = client.record_job_comparison(header, values)
    for line in verdict_lines(stored):
        emit_line(line)
    if stored.complete:
        listing = f"topo-tune admin job comparisons --job-id {shlex.quote(job_id)}"
        emit_line(f"  recorded as {stored.id}: {listing}")
