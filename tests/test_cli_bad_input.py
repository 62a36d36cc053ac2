"""Out-of-range numbers on the command line: a one-line usage error naming the option, never a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from topo_tune.cli.main import cli

CLOSED = "127.0.0.1:1"


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        pytest.param(["admin", "bench", "run", "-e", "18446744073709551616"], "'--max-bytes' / '-e'", id="bench-e"),
        pytest.param(["admin", "bench", "run", "-b", "99999999999999999999G"], "'--min-bytes' / '-b'", id="bench-b"),
    ],
)
def test_a_size_past_the_wire_limit_is_a_usage_error_naming_the_option(argv: list[str], option: str) -> None:
    result = CliRunner().invoke(
        cli, [*argv, "--controller", CLOSED], env={"TOPO_TUNE_TOKEN": "t"}, prog_name="topo-tune"
    )
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"Error: Invalid value for {option}: "), result.output
    assert "larger than the largest size" in last
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        pytest.param(
            ["--gate-max-bytes", "99999999999999999999999"],
            "'--gate-max-bytes': input should be less than or equal to 17179869184",
            id="gate-max-bytes",
        ),
        pytest.param(["--gate-min-bytes", "1T"], "'--gate-min-bytes': expected a size such as", id="gate-min-bytes"),
        pytest.param(["--gate-repeats", "0"], "'--gate-repeats': input should be greater than or equal to 1", id="rep"),
        pytest.param(["--gate-iters", "many"], "'--gate-iters': expected integer, got 'many'", id="gate-iters"),
    ],
)
def test_a_gate_flag_out_of_its_cluster_yaml_bounds_is_a_usage_error_naming_it(argv: list[str], error: str) -> None:
    result = CliRunner().invoke(
        cli,
        ["admin", "rollout", "create", "v1", *argv, "--controller", CLOSED],
        env={"TOPO_TUNE_TOKEN": "t"},
        prog_name="topo-tune",
    )
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"Error: Invalid value for {error}"), result.output


def test_rollout_help_gives_the_gate_keys_and_defaults_of_the_model() -> None:
    text = " ".join(CliRunner().invoke(cli, ["admin", "rollout", "create", "--help"]).output.split())
    assert "[cluster.yaml rollout.gate.repeats, else 8]" in text
    assert "[cluster.yaml rollout.gate.maxBytes, else 256M]" in text
    assert "min_gain [0.03]" in text and "max_drop [0.2]" in text
