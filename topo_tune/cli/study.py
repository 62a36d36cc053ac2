"""``topo-tune admin study``: studies run by the controller (the pass of `topo-tune init`, on known nodes)."""

from __future__ import annotations

import click

from topo_tune.cli.admin import admin, connected
from topo_tune.cli.output import emit_data, emit_line, emit_table
from topo_tune.cli.setting_options import setting_option
from topo_tune.client.admin import AdminClient
from topo_tune.config.cluster import SearchConfig
from topo_tune.errors import ControllerError
from topo_tune.ids import StudyId
from topo_tune.study_record import Study, StudyRequest, StudyStatus
from topo_tune.wire.studies import study_data, study_trial_data, study_trials_data


def _weights(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for value in values:
        key, sep, weight = value.partition("=")
        try:
            out[key] = float(weight) if sep else 1.0
        except ValueError:
            raise click.BadParameter(f"expected COLLECTIVE[=WEIGHT], got {value!r}") from None
    return out


def _pairs(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        key, sep, setting = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {value!r}")
        out[key] = setting
    return out


def _print(info: Study, fmt: str) -> None:
    if fmt != "table":
        emit_data(study_data(info), fmt)
        return
    best = "-" if info.best_value is None else f"{info.best_value:.3f}x"
    rows = [
        ("status", info.status.value + (" (SIMULATED)" if info.simulated else "")),
        ("progress", f"{info.phase or '-'} {info.done}/{info.total}"),
        ("best so far", best),
        ("result", info.result or "-"),
        ("config version", info.config_version or "-"),
        ("nodes", ", ".join(info.nodes)),
        ("message", info.message or "-"),
    ]
    emit_table(f"study {info.study_id}", ("FIELD", "VALUE"), rows)


@admin.group()
def study() -> None:
    """Studies the controller runs: search NCCL settings and rank orders, prove the winner."""


@study.command()
@click.option("--id", "study_id", default="", help="Your own study id (starting it again resumes it).")
@click.option("--nodes", default="", help="Comma-separated node names [every ready node].")
@click.option("--collective", "collectives", multiple=True, callback=_weights, help="COLLECTIVE[=WEIGHT]; repeatable.")
@setting_option(SearchConfig, "budget", "--budget", key=None)
@setting_option(SearchConfig, "sampler", "--sampler", key=None)
@setting_option(SearchConfig, "seed", "--seed", key=None)
@setting_option(SearchConfig, "min_bytes", "--min-bytes", key=None)
@setting_option(SearchConfig, "max_bytes", "--max-bytes", key=None)
@click.option("--site", "site_fixed", multiple=True, callback=_pairs, help="Site-fixed NCCL_KEY=VALUE; repeatable.")
@setting_option(SearchConfig, "finalists", "--finalists", key=None)
@setting_option(SearchConfig, "proof_pairs", "--proof-pairs", key=None)
@click.option(
    "--cuda-graph/--eager",
    default=None,
    help="Time trials as CUDA graphs (nccl-tests -G; nccl nodes only), so sizes under a few MiB show NCCL, not "
    "Python, or eagerly (each call pays the CPU's 25-45 us launch cost) [graphs on nccl nodes, eager otherwise].",
)
@setting_option(
    SearchConfig,
    "tuner_table",
    "--tuner-table",
    key=None,
    help="measure a tuner-plugin table composed from the per-size winners as one more trial",
)
@click.option(
    "--wait/--no-wait",
    default=False,
    show_default=True,
    help="Wait until the study ends; exit 1 when it failed or was cancelled.",
)
@connected
def start(
    client: AdminClient,
    fmt: str,
    study_id: str,
    nodes: str,
    collectives: dict[str, float],
    budget: int | None,
    sampler: str | None,
    seed: int | None,
    min_bytes: int | None,
    max_bytes: int | None,
    site_fixed: dict[str, str],
    finalists: int | None,
    proof_pairs: int | None,
    cuda_graph: bool | None,
    tuner_table: bool | None,
    wait: bool,
) -> None:
    """Start a study on the controller (or resume one with the same --id)."""
    if finalists == 0:
        raise click.BadParameter(
            "0 cannot be sent (0 on the wire asks for the default): give 1 or more", param_hint="--finalists"
        )
    info = client.start_study(
        StudyRequest(
            study_id=study_id,
            nodes=tuple(n.strip() for n in nodes.split(",") if n.strip()),
            collectives=collectives,
            budget=budget or 0,  # 0, "" or unset: the controller's default, the model's (cluster_config.SearchConfig)
            sampler=sampler or "",
            seed=seed or 0,
            min_bytes=min_bytes or 0,
            max_bytes=max_bytes or 0,
            site_fixed=site_fixed,
            finalists=finalists or 0,
            proof_pairs=proof_pairs or 0,
            cuda_graph=cuda_graph,
            no_tuner_table=tuner_table is False,
        )
    )
    if wait and info.status is StudyStatus.RUNNING:
        info = client.watch_study(info.study_id)  # the controller's stream: nothing is sent while it runs
    _print(info, fmt)
    if wait and info.status in (StudyStatus.FAILED, StudyStatus.CANCELLED):
        raise ControllerError(f"study {info.study_id} {info.status.value}: {info.message}")


@study.command()
@click.argument("study_id", metavar="ID")
@connected
def status(client: AdminClient, fmt: str, study_id: str) -> None:
    """Where a study stands: phase, trials done, best so far, result."""
    _print(client.get_study(StudyId(study_id)), fmt)


@study.command("list")
@connected
def list_studies(client: AdminClient, fmt: str) -> None:
    """Recent studies, newest first."""
    found = client.list_studies()
    if fmt != "table":
        emit_data([study_data(s) for s in found], fmt)
        return
    rows = [(s.study_id, s.status.value, s.result or "-", s.config_version or "-") for s in found]
    emit_table(f"{len(found)} studies", ("ID", "STATUS", "RESULT", "CONFIG"), rows)


@study.command()
@click.argument("study_id", metavar="ID")
@connected
def trials(client: AdminClient, fmt: str, study_id: str) -> None:
    """Every trial of a study, with its state, value and settings."""
    found = client.study_trials(StudyId(study_id))
    if fmt != "table":
        emit_data(study_trials_data(found), fmt)
        return
    rows = [
        (
            str(t.number),
            t.state,
            "-" if t.value is None else f"{t.value:.4f}",
            " ".join(f"{k}={v}" for k, v in sorted(t.env.items())),
            t.reason or "",
        )
        for t in found.trials
    ]
    emit_table(f"study {study_id}: {len(rows)} trials", ("#", "STATE", "VALUE", "PARAMS", "REASON"), rows)


@study.command()
@click.argument("study_id", metavar="ID")
@connected
def best(client: AdminClient, fmt: str, study_id: str) -> None:
    """The best trial so far and, once proven, the result."""
    found = client.study_trials(StudyId(study_id))
    info = client.get_study(StudyId(study_id))
    chosen = next((t for t in found.trials if t.number == found.best_trial), None)
    if fmt != "table":
        emit_data({"study": study_data(info), "best_trial": study_trial_data(chosen) if chosen else None}, fmt)
        return
    if chosen is None:
        emit_line(f"study {study_id}: no completed trial yet")
    else:
        params = " ".join(f"{k}={v}" for k, v in sorted(chosen.env.items()))
        emit_line(f"study {study_id}: best trial {chosen.number}, {chosen.value or 0:.4f}x the defaults: {params}")
    emit_line(
        f"result: {info.result or 'not proven yet'}" + (f" ({info.config_version})" if info.config_version else "")
    )


@study.command()
@click.argument("study_id", metavar="ID")
@connected
def cancel(client: AdminClient, fmt: str, study_id: str) -> None:
    """Stop a running study (its trials are kept; start it again with the same id to resume)."""
    _print(client.cancel_study(StudyId(study_id)), fmt)
