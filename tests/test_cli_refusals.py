"""A value the controller refuses is reported in one line naming the flag or argument the user typed, when the
command is given (a study's workload and site settings too, not once the study runs).

Every command drives a real controller (gRPC on loopback, SQLite) with two sim agents on racks r1 and r2,
through the real CLI; the request's own field names (``canary_rack``, ``gate.repeats``, ``sizes.min_bytes``)
must not show.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tests.controller.test_benchmark_jobs_service import RunningAgent, agents, jobs_controller, registered  # noqa: F401
from tests.support.processes import TOKEN
from topo_tune.cli.field_flags import ALIASES, naming_flags, spelled
from topo_tune.cli.main import cli
from topo_tune.controller.server import Controller
from topo_tune.errors import RequestRefused, ValidationError

BAD_ID = "bad/id"
CONF = "nccl.conf=CONF"  # CONF: a valid nccl.conf the test writes
CASES: list[tuple[str, str, str]] = [
    # (command line, how the error line starts after "topo-tune: error: ", a request field it must not name)
    ("admin nodes --rack bad_rack!", "--rack: not a valid node name", "rack:"),
    ("admin node bad!", "NAME: not a valid node name", "name:"),
    ("admin rediscover bad!", "NODE: not a valid node name", "node_name"),
    ("admin rediscover n1 n1", "NODE: 'n1' is listed twice", "node_names"),
    ("admin rediscover n1 n2 --id bad/id", "--id: not a valid command id", "command_id_prefix"),
    ("admin drain bad!", "NODE: not a valid node name", "node_name"),
    ("admin undrain n1 --id bad/id", "--id: not a valid command id", "command_id"),
    ("admin command bad/id", "ID: not a valid command id", "command_id"),
    ("admin commands --node bad!", "--node: not a valid node name", "node_name"),
    ("admin bench run --nodes n1,bad!", "--nodes: not a valid node name", "nodes[1]"),
    ("admin bench run --nodes n1 --dtype nope", "--dtype: 'nope' is not supported", "dtype '"),
    ("admin bench run --nodes n1 -b 64M -e 8", "--max-bytes: (8) is below --min-bytes", "sizes."),
    ("admin bench run --nodes n1 -f 1 -b 8 -e 64", "--step-factor: must be >= 2 when --min-bytes", "_bytes"),
    ("admin bench run --nodes n1 --ranks-per-node 1000", "--ranks-per-node=1000 but nodes", "ranks_per_node"),
    ("admin bench run --nodes n1 --cuda-graph", "--cuda-graph: CUDA graphs need the nccl backend", "cuda_graph"),
    ("admin bench show bad/id", "ID: not a valid command id", "job_id"),
    ("admin probe run --nodes n1", "--nodes: a probe round needs at least two ready nodes", "nodes:"),
    ("admin probe run", "--nodes (not given): sim nodes have no network to probe", "nodes:"),
    ("admin probe show bad/id", "ID: not a valid command id", "round_id"),
    ("admin study start --id bad/id", "--id: not a valid study id", "study_id"),
    ("admin study start --nodes bad!", "--nodes: not a valid node name", "nodes[0]"),
    ("admin study start --min-bytes 64M --max-bytes 8", "--max-bytes must not be below --min-bytes", "Bytes"),
    ("admin study start --cuda-graph", "--cuda-graph: CUDA graphs need backend nccl", "cudaGraph"),
    ("admin study start --collective nope", "--collective nope: unknown collective; known: all_reduce", "workload"),
    ("admin study start --collective all_reduce=-1", "--collective all_reduce: weight must be", "workload"),
    ("admin study start --site FOO=1", "--site FOO: not a site setting", "site_fixed"),
    ("admin study status bad/id", "ID: not a valid study id", "study_id"),
    ("admin study cancel bad/id", "ID: not a valid study id", "study_id"),
    ("admin rollout create --dry-run", "CONFIG_VERSION (not given): give a known version id", "config_version"),
    (f"admin rollout create --file {CONF} --id bad/id --dry-run", "--id: not a valid command id", "rollout_id"),
    ("admin rollout create --file bad=CONF --dry-run", "--file bad: not a config file name", "files["),
    (f"admin rollout create --file {CONF} --canary-rack nope --dry-run", "--canary-rack: no rack named", "canary_"),
    (f"admin rollout create --file {CONF} --gate-repeats 2 --dry-run", "--gate-repeats: 2 A/B repeats", "gate."),
    (
        f"admin rollout create --file {CONF} --canary 5 --dry-run",
        "--canary: 5 canary nodes, more than the 2",
        "canary_",
    ),
    (f"admin rollout create --file {CONF} --pause-between 1000h --dry-run", "--pause-between: must be 0 to", "pause_"),
    (
        f"admin rollout create --file {CONF} --gate-min-bytes 1G --dry-run",
        "--gate-max-bytes (not given) must not be below --gate-min-bytes",
        "Bytes",
    ),
    (
        f"admin rollout create --file {CONF} --gate-cuda-graph --dry-run",
        "--gate-cuda-graph: CUDA graphs need the nccl backend",
        "gate.",
    ),
    (f"admin rollout create --file {CONF} --threshold foo=1 --dry-run", "--threshold foo: unknown key", "thresholds"),
    (
        f"admin rollout create --file {CONF} --threshold alpha=5 --threshold min_gain=7 --dry-run",
        "--threshold min_gain: input should be less than 1; --threshold alpha: input should be less than 0.5",
        "thresholds",
    ),
    ("admin rollout status bad/id", "ROLLOUT_ID: not a valid command id", "rollout_id"),
    ("admin rollout history bad/id", "ROLLOUT_ID: not a valid command id", "rollout_id"),
    ("admin rollout pause bad/id", "ROLLOUT_ID: not a valid command id", "rollout_id"),
    ("admin rollout rollback bad/id", "ROLLOUT_ID: not a valid command id", "rollout_id"),
    ("admin config show bad", "ID: not a config version id", "id:"),
    ("admin config diff bad cv-0000000000000000", "OLD or NEW: not a config version id", "id:"),
    ("admin config export bad --dir DIR", "ID: not a config version id", "id:"),
    ("admin credential issue --node bad!", "--node: not a valid node name", "node_name"),
    ("admin credential revoke nope", "ID: expected the 12 hex digits", "id:"),
    ("admin drift run --version bad", "--version: bad is not the active version", "config_version"),
    ("admin drift show bad/id", "ID: not a valid command id", "check_id"),
    ("hostfile --nodes n1,bad!", "--nodes: not a valid node name", "nodes["),
    ("env --job-id j1 --nodes n1,bad! --node n1", "--nodes: not a valid node name", "nodes["),
]


def _argv(line: str, tmp_path: Path) -> list[str]:
    return [w.replace("CONF", str(tmp_path / "nccl.conf")).replace("DIR", str(tmp_path / "out")) for w in line.split()]


async def test_each_refused_value_names_the_flag_it_came_from(
    jobs_controller: Controller,  # noqa: F811
    agents: Callable[..., RunningAgent],  # noqa: F811
    tmp_path: Path,
) -> None:
    await registered(agents("n1", "sim", rack="r1"), agents("n2", "sim", rack="r2"))
    (tmp_path / "nccl.conf").write_text("NCCL_MIN_CTAS=16\n")
    address = ["--controller", f"127.0.0.1:{jobs_controller.port}"]
    wrong: list[str] = []
    for line, starts, internal in CASES:
        result = await asyncio.to_thread(
            CliRunner().invoke, cli, [*_argv(line, tmp_path), *address], env={"TOPO_TUNE_TOKEN": TOKEN}
        )
        said = result.stderr.strip()
        if result.exit_code != 1 or "\n" in said or not said.startswith(f"topo-tune: error: {starts}"):
            wrong.append(f"{line}\n  exit {result.exit_code}: {said or result.output.strip()}")
        elif internal in said.removeprefix(f"topo-tune: error: {starts}"):
            wrong.append(f"{line}\n  names {internal!r} further on: {said}")
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize(("path", "fields"), sorted(ALIASES.items()))
def test_each_alias_names_a_parameter_of_its_command(path: str, fields: dict[str, str]) -> None:
    command: click.Command = cli
    ctx = click.Context(cli, info_name="topo-tune")
    for word in path.split():
        assert isinstance(command, click.Group), path
        found = command.get_command(ctx, word)
        assert found is not None, f"no command {path!r}"
        command = found
    params = {p.name for p in command.params}
    for field, names in fields.items():
        missing = [name for name in names.split() if name not in params]
        assert not missing, f"{path}: {field} → {missing}: not parameters of the command"
        assert field not in params, f"{path}: {field} is a parameter's own name; the alias is not needed"


def _context(path: str) -> click.Context:
    ctx = click.Context(cli, info_name="topo-tune")
    for word in path.split():
        assert isinstance(ctx.command, click.Group), path
        command = ctx.command.get_command(ctx, word)
        assert command is not None, path
        ctx = click.Context(command, parent=ctx, info_name=word)
    return ctx


@pytest.mark.parametrize(
    ("path", "field", "reason", "said"),
    [
        ("admin probe run", "message_bytes", "a multiple of 8", "--size: a multiple of 8"),
        ("admin probe run", "pair_deadline_s", "at most 3600", "--pair-deadline: at most 3600"),
        ("admin bench run", "env.NCCL_ALGO", "is set by the agent", "--env NCCL_ALGO: is set by the agent"),
        ("admin bench run", "deadline_s", "at most 600", "--deadline: at most 600"),
        ("admin rollout create", "pause_between_s", "must be 0 or more", "--pause-between: must be 0 or more"),
        ("admin rollout create", "max_parallel_racks", "at least 1", "--max-parallel-racks: at least 1"),
        ("admin rollout create", "canary_nodes", "must be 0 or more", "--canary: must be 0 or more"),
        ("admin rollout create", "nodes", "the cluster has no nodes", "nodes: the cluster has no nodes"),
        ("admin bench run", "", "see docs/security.md for NCCL_DEBUG", "see docs/security.md for NCCL_DEBUG"),
    ],
)
def test_a_field_is_spelled_as_the_flag_it_came_from(path: str, field: str, reason: str, said: str) -> None:
    spelled_field, spelled_reason = spelled(_context(path), field, reason)
    assert ": ".join(p for p in (spelled_field, spelled_reason) if p) == said


def test_only_the_controllers_refusal_is_spelled_as_flags_not_a_reply_this_client_found_malformed() -> None:
    ctx = _context("admin rollout create")
    with pytest.raises(RequestRefused) as refused, naming_flags(ctx):
        raise RequestRefused("max_parallel_racks", "at least 1")
    assert str(refused.value) == "--max-parallel-racks: at least 1"
    # The same field in the controller's answer is about the reply (e.g. a rollout the client cannot read).
    with pytest.raises(ValidationError) as malformed, naming_flags(ctx):
        raise ValidationError("max_parallel_racks", "not an integer")
    assert str(malformed.value) == "max_parallel_racks: not an integer", "no flag of the user's set it"


async def test_a_controller_built_without_the_tuning_pass_refuses_a_study_in_one_line_and_stores_none(
    jobs_controller: Controller,  # noqa: F811
    agents: Callable[..., RunningAgent],  # noqa: F811
) -> None:
    await registered(agents("n1", "sim", rack="r1"))
    address = ["--controller", f"127.0.0.1:{jobs_controller.port}"]

    def study(*args: str) -> str:
        result = CliRunner().invoke(cli, ["admin", "study", *args, *address], env={"TOPO_TUNE_TOKEN": TOKEN})
        assert result.exit_code == 1, result.output
        return str(result.stderr.strip())

    refused = await asyncio.to_thread(study, "start", "--id", "st-none")
    assert refused == "topo-tune: error: this controller was built without the tuning pass, so it runs no studies"
    assert await asyncio.to_thread(study, "status", "st-none") == "topo-tune: error: no study with id 'st-none'"
