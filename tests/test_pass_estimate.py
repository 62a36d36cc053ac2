"""``init --dry-run``: the pass's cost from cluster.yaml alone, before any controller, agent or node is touched."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from topo_tune.cli.main import cli
from topo_tune.config.cluster import load_cluster_config
from topo_tune.nccl.backends import Backend
from topo_tune.tuning_pass.pass_estimate import estimate_pass

DEMO = Path(__file__).parent.parent / "examples" / "demo-cluster.yaml"


def test_dry_run_prints_the_demos_jobs_per_phase_and_their_time_and_touches_nothing(tmp_path: Path) -> None:
    output = tmp_path / "out"
    result = CliRunner().invoke(cli, ["init", "--cluster-config", str(DEMO), "--output", str(output), "--dry-run"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "estimate for 8 nodes on the sim backend (nothing was started or drained):"
    # The demo: 2 collectives, one sweep each; 3 rungs; proof pairs of the full ladder and 3 more small runs.
    assert lines[1].startswith("  search: 80 to 240 jobs; budget 40 trials x 2 to 6 jobs")
    assert lines[2].startswith("  proof: 288 to 1440 jobs; finalists 3 x 6 to 30 pairs x 16 jobs a pair")
    fixed = Backend.SIM.job_fixed_s
    assert fixed is not None
    assert lines[3] == (
        f"  total: 368 to 1680 jobs, {_duration(368 * fixed)} to {_duration(1680 * fixed)} wall, "
        f"{368 * fixed * 8:.0f} to {1680 * fixed * 8:.0f} node-seconds (at {fixed:g} s a job)"
    )
    assert not output.exists(), "a dry run creates no output directory"


def test_a_backend_without_a_recorded_job_cost_gets_jobs_and_no_time() -> None:
    gloo = load_cluster_config(Path(__file__).parent.parent / "examples" / "local-gloo.yaml")
    lines = estimate_pass(gloo).lines()
    assert lines[-1].endswith("no fixed per-job cost is recorded for gloo: no time")
    assert all(" s wall" not in line for line in lines)


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"
