"""The scenarios' long-lived admin process reports a command exactly as a ``topo-tune`` process of its own."""

from __future__ import annotations

from pathlib import Path

from tests.support.admin_shell import AdminShell
from tests.support.processes import cli_env, free_port, run_cli


def test_exit_codes_and_output_are_those_of_a_process_per_command(tmp_path: Path) -> None:
    shell = AdminShell([], cli_env(), tmp_path / "admin.log")
    unreachable = ["admin", "nodes", "--controller", f"127.0.0.1:{free_port()}", "-o", "json"]
    try:
        for argv in (unreachable, ["admin", "nodes", "--output", "xml"]):
            alone, shared = run_cli(*argv), shell.run(argv, timeout=30)
            assert (shared.returncode, shared.stdout, shared.stderr) == (alone.returncode, alone.stdout, alone.stderr)
        assert [shell.run(unreachable, timeout=30).returncode for _ in range(3)] == [1, 1, 1], "one process, many calls"
    finally:
        shell.close()
