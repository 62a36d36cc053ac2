"""``init --dry-run``: the pass's cost from cluster.yaml alone, before any controller, agent or node is touched."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from topo_tune.cli.main import cli
from topo_tune.config.cluster import load_cluster_config
from topo_tune.nccl import backends
from topo_tune.nccl.backends import Backend
from topo_tune.tuning_pass.pass_estimate import estimate_pass

DEMO = Path(__file__).parent.parent / "examples" / "demo-cluster.yaml"


def test_dry_run_prints_the_demos_jobs_per_phase_and_their_time_and_touches_nothing(tmp_path: Path) -> None:
    output = tmp_path / "out"
    result = CliRunner().invoke(cli, ["init", "--cluster-config", str(DEMO), "--output", str(output), "--dry-run"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "estimate for 8 nodes on the sim backend (nothing was started or drained):"
    # The demo: 2 collectives, one sweep each; 3 rungs, a job each; proof pairs of the full ladder and 3 more
    # small runs, each pair one job.
    assert lines[1].startswith("  search: 40 to 120 jobs (80 to 240 specs); budget 40 trials x 1 to 3 jobs of 2 to 6")
    assert lines[2].startswith("  proof: 18 to 90 jobs (288 to 1440 specs); finalists 3 x 6 to 30 pairs x 1 job of 16")
    fixed = Backend.SIM.job_fixed_s
    assert fixed is not None
    assert lines[3] == (
        f"  total: 58 to 210 jobs (368 to 1680 specs), {_duration(58 * fixed)} to {_duration(210 * fixed)} wall, "
        f"{58 * fixed * 8:.0f} to {210 * fixed * 8:.0f} node-seconds (at {fixed:g} s a job)"
    )
    assert not output.exists(), "a dry run creates no output directory"


def test_a_backend_without_a_recorded_job_cost_gets_jobs_and_no_time(monkeypatch: pytest.MonkeyPatch) -> None:
    gloo = load_cluster_config(Path(__file__).parent.parent / "examples" / "local-gloo.yaml")
    assert (
        estimate_pass(gloo)
        .lines()[-1]
        .endswith(f"(at {Backend.GLOO.job_fixed_s:g} s a spec (each its own rendezvous))")
    )
    monkeypatch.delitem(backends._JOB_FIXED_S, Backend.GLOO)
    lines = estimate_pass(gloo).lines()
    assert lines[-1].endswith("no fixed per-job cost is recorded for gloo: no time")
    assert all(" s wall" not in line for line in lines)


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def test_on_a_backend_that_launches_workers_every_spec_pays_the_fixed_cost() -> None:
    # Each spec of a job makes its own rendezvous (in kept or new workers: NCCL reads its environment once per
    # process): the time counts specs, not jobs.
    demo = load_cluster_config(DEMO).model_copy(update={"backend": Backend.NCCL})
    fixed = Backend.NCCL.job_fixed_s
    assert fixed is not None
    total = estimate_pass(demo).lines()[-1]
    assert total == (
        f"  total: 58 to 210 jobs (368 to 1680 specs), {_duration(368 * fixed)} to {_duration(1680 * fixed)} wall, "
        f"{368 * fixed * 8:.0f} to {1680 * fixed * 8:.0f} node-seconds (at {fixed:g} s a spec (each its own "
        "rendezvous))"
    )
