"""``topo-tune admin rollout``: create, watch and steer rollouts (Argo Rollouts' verbs)."""

from __future__ import annotations

import dataclasses
import getpass
import socket
from collections.abc import Callable
from pathlib import Path

import click

from topo_tune.cli.admin import connected
from topo_tune.cli.output import emit_data, emit_line, emit_lines, emit_table, shown
from topo_tune.cli.setting_options import setting_option, show_default
from topo_tune.client.admin import AdminClient
from topo_tune.client.watch_step import WatchStep
from topo_tune.config.cluster import RolloutGateConfig, RolloutThresholdsConfig
from topo_tune.config.values import parse_duration
from topo_tune.errors import ControllerError
from topo_tune.ids import ConfigVersionId, RolloutId
from topo_tune.rollout_record import GateMeasurement, RolloutAction, RolloutInfo, RolloutRequest
from topo_tune.versions.version import FILE_NAMES
from topo_tune.wire.rollouts import rollout_data, rollout_transition_data

_GATE = "rollout.gate"  # the controller's cluster.yaml: its defaults for every rollout
PAUSED_EXIT = 3
"""``rollout status --wait``'s exit status when the rollout waits for an operator (1: it failed; 0: completed)."""


def actor() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def _seconds(value: str) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--pause-between") from None
    assert isinstance(seconds, float)
    return seconds


def _key_values(values: tuple[str, ...], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint=option)
        out[key] = value
    return out


def show(info: RolloutInfo, fmt: str) -> None:
    if fmt != "table":
        emit_data(rollout_data(info), fmt)
        return
    sweep = info.gate or GateMeasurement()  # only a listed rollout has none (and is not shown here)
    measured = (
        f"gates: {sweep.repeats} A/B repeats of all_reduce {sweep.min_bytes}..{sweep.max_bytes} B "
        f"(x{sweep.step_factor}), {sweep.iters} iters{', CUDA graphs' if sweep.cuda_graph else ''}; "
        + ", ".join(f"{k}={v:g}" for k, v in sorted(info.thresholds.items()))
    )
    if info.dry_run:
        emit_lines(f"plan for {shown(info.config_version)}:\n{info.plan}\n{measured}")
        return
    emit_line(f"rollout {info.id}: {info.previous_version or 'defaults'} → {info.config_version}  [{info.phase}]")
    if info.reason:
        emit_line(f"reason: {info.reason}")
    emit_line(measured)
    gates = {g.wave: g for g in info.gates}  # the latest attempt of each wave
    rows = []
    for wave in info.waves:
        gate = gates.get(wave.index)
        verdict = f"{gate.outcome} ({gate.time_change:+.1%}, p={gate.p_gain:.3g})" if gate else "-"
        marker = "▶" if wave.index == info.wave and info.phase not in ("completed", "rolled_back") else ""
        rows.append(
            (
                f"{marker}{wave.index}",
                wave.kind,
                ", ".join(wave.racks) or "-",
                str(len(wave.nodes)),
                wave.phase,
                verdict,
            )
        )
    emit_table("waves", ("WAVE", "KIND", "RACKS", "NODES", "PHASE", "GATE"), rows)
    if info.node_errors:
        failing = [(name, info.node_phases.get(name, "?"), why) for name, why in sorted(info.node_errors.items())]
        emit_table("nodes whose last apply failed", ("NODE", "PHASE", "REASON"), failing)


@click.group()
def rollout() -> None:
    """Roll a config version out wave by wave: a canary, then rack by rack, each wave gated by an A/B check.

    \b
    A failed gate rolls every applied wave back (last first); an inconclusive gate or a lost node pauses
    the rollout for you: resume (runs the gate again), promote (accept and go on), abort or rollback.
    """


@rollout.command()
@click.argument("config_version", required=False, default="")
@click.option(
    "--file",
    "files",
    multiple=True,
    metavar="NAME=PATH",
    help=f"A file of the version ({', '.join(sorted(FILE_NAMES))}).",
)
@click.option("--canary", "canary_nodes", type=click.IntRange(min=1), help="Canary wave of N nodes (default 1).")
@click.option("--canary-rack", default="", help="A whole rack as the canary wave.")
@click.option("--no-canary", is_flag=True, help="Start directly rack by rack.")
@click.option("--max-parallel-racks", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--pause-between", default="0", help="Wait after each passed gate (90, 30s, 5m, 1h).")
@click.option("--require-approval", is_flag=True, help="Pause after every wave until promoted.")
@click.option(
    "--threshold",
    "thresholds",
    multiple=True,
    metavar="KEY=VALUE",
    help="A gate threshold over cluster.yaml's rollout.thresholds, e.g. min_gain=0.05; repeatable. Keys: "
    + ", ".join(f"{name} [{show_default(f)}]" for name, f in RolloutThresholdsConfig.model_fields.items())
    + ".",
)
@setting_option(RolloutGateConfig, "repeats", "--gate-repeats", key=_GATE)
@setting_option(RolloutGateConfig, "min_bytes", "--gate-min-bytes", key=_GATE)
@setting_option(RolloutGateConfig, "max_bytes", "--gate-max-bytes", key=_GATE)
@setting_option(RolloutGateConfig, "step_factor", "--gate-step-factor", key=_GATE)
@setting_option(RolloutGateConfig, "iters", "--gate-iters", key=_GATE)
@setting_option(RolloutGateConfig, "warmup_iters", "--gate-warmup-iters", key=_GATE)
@click.option(
    "--gate-cuda-graph/--gate-eager",
    "gate_cuda_graph",
    default=None,
    help="Time the gate's sizes as CUDA graphs (nccl-tests -G; nccl nodes only) or as eager calls, which add the "
    "CPU's launch cost to each [cluster.yaml rollout.gate.cudaGraph: graphs with backend nccl, else eager]. "
    "Drift checks measure as the gates did.",
)
@click.option("--id", "rollout_id", default="", help="Your own rollout id.")
@click.option("--dry-run", is_flag=True, help="Show the plan only.")
@click.option("--yes", "-y", is_flag=True, help="Start without asking after showing the plan.")
@connected
def create(
    client: AdminClient,
    fmt: str,
    config_version: str,
    files: tuple[str, ...],
    canary_nodes: int | None,
    canary_rack: str,
    no_canary: bool,
    max_parallel_racks: int,
    pause_between: str,
    require_approval: bool,
    thresholds: tuple[str, ...],
    gate_repeats: int | None,
    gate_min_bytes: int | None,
    gate_max_bytes: int | None,
    gate_step_factor: int | None,
    gate_iters: int | None,
    gate_warmup_iters: int | None,
    gate_cuda_graph: bool | None,
    rollout_id: str,
    dry_run: bool,
    yes: bool,
) -> None:
    """Plan a rollout of CONFIG_VERSION (or of the version made of --file ...), show it, and start it."""
    contents: dict[str, str] = {}
    for name, path in _key_values(files, "--file").items():
        try:
            contents[name] = Path(path).read_text()
        except OSError as error:
            raise click.BadParameter(f"{name}={path}: {error.strerror}", param_hint="--file") from None
    try:
        limits = {k: float(v) for k, v in _key_values(thresholds, "--threshold").items()}
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--threshold") from None
    if canary_rack and (canary_nodes or no_canary):
        raise click.UsageError("--canary-rack excludes --canary and --no-canary")
    request = RolloutRequest(
        config_version=ConfigVersionId(config_version),
        files=contents,
        canary_nodes=canary_nodes or 0,
        canary_rack=canary_rack,
        no_canary=no_canary,
        max_parallel_racks=max_parallel_racks,
        pause_between_s=_seconds(pause_between),
        require_approval=require_approval,
        thresholds=limits,
        gate=GateMeasurement(  # unset: 0, the controller's default (cluster.yaml's rollout.gate)
            repeats=gate_repeats or 0,
            min_bytes=gate_min_bytes or 0,
            max_bytes=gate_max_bytes or 0,
            step_factor=gate_step_factor or 0,
            iters=gate_iters or 0,
            warmup_iters=gate_warmup_iters or 0,
            cuda_graph=gate_cuda_graph,  # None: unset
        ),
        rollout_id=RolloutId(rollout_id),
        actor=actor(),
        dry_run=True,
    )
    plan = client.create_rollout(request)
    if dry_run or fmt == "table":
        show(plan, fmt)
    if dry_run:
        return
    if not yes:
        click.confirm("Start this rollout?", abort=True, err=True)
    show(client.create_rollout(dataclasses.replace(request, dry_run=False)), fmt)


@rollout.command()
@click.argument("rollout_id", required=False, default="")
@click.option(
    "--wait/--no-wait",
    default=False,
    show_default=True,
    help="Follow the rollout to its end (completed, rolled back or aborted), a line on stderr per step; "
    f"exit 1 unless it completed. A pause that waits for an operator ends the wait too, with exit status "
    f"{PAUSED_EXIT} and how to go on (a timed pause between waves is waited out).",
)
@connected
def status(client: AdminClient, fmt: str, rollout_id: str, wait: bool) -> None:
    """Show a rollout (default: the active one, else the latest) with its waves and gate verdicts."""
    info = client.get_rollout(RolloutId(rollout_id))
    if wait and not info.ended and not info.waits_for_operator:
        info = client.watch_rollout(info.id, _step_lines())
    show(info, fmt)
    if wait and info.waits_for_operator:
        emit_line(
            f"topo-tune: rollout {info.id} is paused: {info.reason or 'paused'}. It waits for an operator: "
            f"`topo-tune admin rollout resume {info.id}` (a paused gate runs again), `promote {info.id}` "
            f"(accept and go on), `abort {info.id}` or `rollback {info.id}`",
            err=True,
        )
        raise click.exceptions.Exit(PAUSED_EXIT)
    if wait and info.phase != "completed":
        raise ControllerError(f"rollout {info.id} {info.phase}: {info.reason}")


def _step_lines() -> Callable[[WatchStep[RolloutInfo]], None]:
    """Prints ``# verifying, 1/3 waves done (reason)`` on stderr each time the rollout's phase or wave moves."""
    shown: list[tuple[str, int, int]] = []

    def step(update: WatchStep[RolloutInfo]) -> None:
        rollout = update.value
        now = (rollout.phase, rollout.wave, update.done)
        if not shown or shown[-1] != now:
            reason = f" ({rollout.reason})" if rollout.reason else ""
            emit_line(f"# {rollout.phase}, {update.done}/{update.total} waves done{reason}", err=True)
            shown.append(now)

    return step


@rollout.command(name="list")
@connected
def list_rollouts(client: AdminClient, fmt: str) -> None:
    """List recent rollouts, newest first."""
    found = client.list_rollouts()
    if fmt != "table":
        emit_data([rollout_data(r) for r in found], fmt)
        return
    rows = [
        (r.id, r.config_version, r.previous_version or "defaults", r.phase, r.created_by, r.reason or "-")
        for r in found
    ]
    emit_table(f"{len(found)} rollouts", ("ID", "VERSION", "PREVIOUS", "PHASE", "BY", "REASON"), rows)


@rollout.command()
@click.argument("rollout_id")
@connected
def history(client: AdminClient, fmt: str, rollout_id: str) -> None:
    """Every transition of a rollout, its waves and nodes, and who or what caused it."""
    found = client.rollout_history(RolloutId(rollout_id))
    if fmt != "table":
        emit_data([rollout_transition_data(t) for t in found], fmt)
        return
    rows = [
        (
            t.at.strftime("%Y-%m-%d %H:%M:%S"),
            t.subject,
            f"{t.before or '-'} → {t.after}",
            t.actor,
            t.message,
        )
        for t in found
    ]
    emit_table(f"rollout {rollout_id}", ("AT (UTC)", "SUBJECT", "CHANGE", "BY", "MESSAGE"), rows)


def _verb(name: str, action: RolloutAction, summary: str) -> None:
    @click.argument("rollout_id")
    @click.option("--reason", default="", help="Recorded in the history.")
    @connected
    def command(client: AdminClient, fmt: str, rollout_id: str, reason: str) -> None:
        show(client.change_rollout(RolloutId(rollout_id), action, reason=reason, actor=actor()), fmt)

    command.__doc__ = summary
    rollout.command(name=name)(command)


_verb("pause", RolloutAction.PAUSE, "Pause a running rollout.")
_verb("resume", RolloutAction.RESUME, "Resume a paused rollout (an inconclusive gate runs again).")
_verb("promote", RolloutAction.PROMOTE, "Skip a pause: accept the paused wave's gate, or start the waiting wave.")
_verb("abort", RolloutAction.ABORT, "Stop a rollout now; its nodes then return to the stable version.")
_verb("rollback", RolloutAction.ROLLBACK, "Return every applied wave to the previous version, last wave first.")
