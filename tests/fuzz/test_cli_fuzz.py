"""The CLI under hypothesis: any arguments end with exit 0, 1 or 2 and, on error, a one-line reason;
never a traceback.

Every command that finishes on its own is exercised with values built from its own parameters (choices,
integer ranges, files of every kind) mixed with stray tokens and arbitrary text; ``NOT_FUZZED`` says which
commands are left out and why.
The only controller address ever given is a closed port on loopback, so nothing leaves the machine.
"""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topo_tune.cli.main import cli

NOT_FUZZED = {("controller", "serve"), ("agent", "run"), ("plugin", "build"), ("init",), ("exec",)}
"""Daemons would serve, ``plugin build`` compiles, ``init`` runs a whole tuning pass and ``exec`` runs a
command: none of them ends promptly on its own, and ``exec`` given arbitrary text would run it."""
CLOSED = "127.0.0.1:1"
SAFE_CONTROLLERS = [CLOSED, "127.0.0.1:0", "127.0.0.1:99999", "", "127.0.0.1", "[::1]:1", ":", "127.0.0.1:-5"]
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
text = st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=30).filter(
    lambda token: not token.startswith("--controller")  # the address comes from SAFE_CONTROLLERS only
)


def leaf_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], click.Command]:
    found: dict[tuple[str, ...], click.Command] = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found.update(leaf_commands(command, (*prefix, name)))
        elif (*prefix, name) not in NOT_FUZZED:
            found[(*prefix, name)] = command
    return found


COMMANDS = leaf_commands(cli)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Paths of every kind a file argument may be given; all inside a scratch directory."""
    root = tmp_path_factory.mktemp("cli-fuzz")
    (root / "empty").write_text("")
    (root / "binary").write_bytes(bytes(range(256)))
    (root / "cluster.yaml").write_text("apiVersion: topo-tune/v1\nracks: [{name: r, nodes: [{name: a}]}]\n")
    (root / "bad.yaml").write_text("racks: [{name: r, nodes: oops}\n")
    (root / "pairs.txt").write_text("a b 100\nb c 10\na c 100\n")
    (root / "xml").write_text("<system version='1'><cpu><pci busid='0000:01:00.0'/></cpu></system>")
    (root / "unreadable").write_text("secret")
    (root / "unreadable").chmod(0)
    (root / "dir").mkdir()
    return [str(root / name) for name in ("empty", "binary", "cluster.yaml", "bad.yaml", "pairs.txt", "xml", "dir")] + [
        str(root / "missing"),
        str(root / "dir" / "missing" / "deeper"),
    ]


def values_for(param: click.Parameter, files: list[str]) -> st.SearchStrategy[str]:
    if param.name in ("address", "controller_address"):
        return st.sampled_from(SAFE_CONTROLLERS)  # never anything that resolves or routes elsewhere
    kind = param.type
    if isinstance(kind, click.Path):
        return st.sampled_from(files)  # never an arbitrary path: some commands write where they are told
    if isinstance(kind, click.Choice):
        return st.one_of(st.sampled_from([str(choice) for choice in kind.choices]), text)
    if isinstance(kind, click.types.IntParamType):
        return st.one_of(st.integers(-(10**12), 10**12).map(str), text)
    if isinstance(kind, click.types.FloatParamType):
        return st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(str), text)
    return st.one_of(text, st.sampled_from(["a", "node-1", "-", "--", "x" * 400]))


@st.composite
def invocations(draw: st.DrawFn, files: list[str]) -> list[str]:
    path = draw(st.sampled_from(sorted(COMMANDS)))
    command = COMMANDS[path]
    groups: list[list[str]] = []  # an option stays next to its value: strays go between groups only
    params = [p for p in command.params if p.name != "help"]
    for param in draw(st.lists(st.sampled_from(params), max_size=6)) if params else []:
        if isinstance(param, click.Argument):
            groups.append([draw(values_for(param, files))])
        elif isinstance(param, click.Option) and param.is_flag:
            groups.append([param.opts[0]])
        else:
            groups.append([draw(st.sampled_from(param.opts)), draw(values_for(param, files))])
    stray = st.one_of(st.sampled_from(["--output", "-o", "--limit", "--bogus", "-x", "--", "json"]), text)
    for _ in range(draw(st.integers(0, 2))):
        groups.insert(draw(st.integers(0, len(groups))), [draw(stray)])
    return [*path, *(token for group in groups for token in group)]


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    return CliRunner(
        env={"TOPO_TUNE_CONTROLLER": CLOSED, "TOPO_TUNE_TOKEN": "fuzz-token", "TOPO_TUNE_LOG_LEVEL": "error"}
    )


@FUZZ
@given(data=st.data())
def test_any_arguments_exit_cleanly_with_a_one_line_reason(
    data: st.DataObject, files: list[str], runner: CliRunner
) -> None:
    argv = data.draw(invocations(files))
    for index, token in enumerate(argv[:-1]):
        assert token != "--controller" or argv[index + 1] in SAFE_CONTROLLERS, argv
    result = runner.invoke(cli, argv, prog_name="topo-tune")
    shown = f"topo-tune {argv!r} exited {result.exit_code}:\n{result.output}"
    assert result.exit_code in (0, 1, 2), shown
    assert result.exception is None or isinstance(result.exception, SystemExit), shown
    assert "Traceback" not in result.output, shown
    if result.exit_code == 1:
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("topo-tune: error: "), shown
    elif result.exit_code == 2:
        reasons = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
        assert len(reasons) == 1, shown
