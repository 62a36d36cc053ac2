"""Rollouts across namespace racks with real gloo agents: one that completes, and one whose second rack's
links are throttled after the canary, so that its gate fails against the canary's bus bandwidth and every
wave rolls back; the controller is SIGKILLed in the middle of that one and resumes it.

The gates measure what a slow CPU fabric and a CI budget allow: one size, three A/B repeats, ``alpha`` 0.15
(three pairs can reach it: every job starts its workers, seconds on a busy 2-core machine), loose
regression margins, and a non-inferiority margin instead of a gain, since NCCL settings change nothing on
gloo. The
throttled rack is caught by the comparison with the canary wave: an A/B on its own nodes slows both arms
alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.netns.conftest import ClusterFactory
from tests.support.netns import ClusterShape, NetnsCluster
from tests.support.waiting import wait_until
from topo_tune.versions.version import ConfigVersion, render_nccl_conf

pytestmark = pytest.mark.netns

SHAPE = ClusterShape(racks={"r1": ["a", "b"], "r2": ["c", "d"]}, rack_mbit=200, cross_rack_mbit=200)
GATES = [
    "--gate-repeats", "3", "--gate-min-bytes", "1M", "--gate-max-bytes", "1M",
    "--gate-iters", "4", "--gate-warmup-iters", "1",
    "--threshold", "alpha=0.15", "--threshold", "min_gain=-0.2", "--threshold", "max_regression=0.2",
    "--threshold", "max_p99_regression=0.5", "--threshold", "max_cv=0.3", "--threshold", "max_drop=0.3",
]  # fmt: skip
FINAL = ("completed", "rolled_back", "aborted")


def rollout(cluster: NetnsCluster, rollout_id: str) -> dict[str, Any]:
    info = cluster.admin_json("rollout", "status", rollout_id)
    assert isinstance(info, dict)
    return info


def reached(cluster: NetnsCluster, rollout_id: str, *phases: str, timeout: float = 240) -> dict[str, Any]:
    """Wait until the rollout is in one of ``phases``; fail at once if it stops elsewhere."""

    def check() -> dict[str, Any] | None:
        info = rollout(cluster, rollout_id)
        return info if info["phase"] in (*phases, *FINAL, "paused") else None

    found: dict[str, Any] = wait_until(check, what=f"rollout {rollout_id} to reach {phases}", timeout=timeout)
    assert found["phase"] in phases, found
    return found


def applied(cluster: NetnsCluster) -> dict[str, str]:
    return {name: str(node["applied_config_version"]) for name, node in cluster.nodes().items()}


def create(cluster: NetnsCluster, tmp_path: Path, version: ConfigVersion, rollout_id: str, *extra: str) -> None:
    conf = tmp_path / f"{rollout_id}.conf"
    conf.write_text(version.files["nccl.conf"])
    cluster.admin_json(
        "rollout", "create", "--file", f"nccl.conf={conf}", "--canary-rack", "r1", "--id", rollout_id, "--yes",
        *GATES, *extra,
    )  # fmt: skip


@pytest.mark.timeout(600)  # four gates of six jobs each: minutes when other work shares the two cores
def test_a_rollout_completes_across_the_racks_and_a_throttled_rack_rolls_back_the_next(
    make_cluster: ClusterFactory, sqlite_url: str, tmp_path: Path
) -> None:
    cluster = make_cluster(SHAPE)
    cluster.start_controller(sqlite_url)
    cluster.start_agents()
    first = ConfigVersion({"nccl.conf": render_nccl_conf({"NCCL_DEBUG": "WARN"})})
    second = ConfigVersion({"nccl.conf": render_nccl_conf({"NCCL_DEBUG": "INFO"})})

    # The canary rack, then the other one: every gate passes, every node on the new version.
    create(cluster, tmp_path, first, "ro-first")
    done = reached(cluster, "ro-first", "completed")
    assert [g["outcome"] for g in done["gates"]] == ["successful", "successful"], done["gates"]
    canary, rack = done["gates"]
    assert rack["reference_busbw_gbps"] == pytest.approx(canary["busbw_gbps"]), "r2 was compared with the canary"
    wait_until(lambda: applied(cluster) == dict.fromkeys(SHAPE.hosts, first.id), what="every node on the version")

    # The next version: its canary passes; then r2's link slows to a quarter before r2's wave is measured.
    create(cluster, tmp_path, second, "ro-second", "--require-approval")
    paused = reached(cluster, "ro-second", "paused")
    assert paused["wave"] == 1 and [g["outcome"] for g in paused["gates"]] == ["successful"], paused

    # The controller is SIGKILLed mid-rollout and started again: the rollout resumes where it stood.
    registrations = {name: int(str(node["registrations"])) for name, node in cluster.nodes().items()}
    assert cluster.controller is not None
    cluster.controller.kill()
    cluster.start_controller(sqlite_url)
    wait_until(
        lambda: (
            {name: (node["state"], node["registrations"]) for name, node in cluster.nodes().items()}
            == {name: ("ready", count + 1) for name, count in registrations.items()}
        ),
        what="every agent back with the restarted controller",
        timeout=60,
        interval=0.3,
    )
    resumed = rollout(cluster, "ro-second")
    assert (resumed["phase"], resumed["wave"], len(resumed["gates"])) == ("paused", 1, 1), resumed
    assert applied(cluster) == {"a": second.id, "b": second.id, "c": first.id, "d": first.id}

    cluster.set_rate("c", "d", 50)
    cluster.admin_json("rollout", "promote", "ro-second")
    ended = reached(cluster, "ro-second", "rolled_back")
    failed = ended["gates"][-1]
    assert (failed["wave"], failed["outcome"]) == (1, "failed"), ended["gates"]
    assert failed["busbw_drop"] > 0.3 and any("below the reference" in r for r in failed["reasons"]), failed
    assert "wave 1 gate failed" in ended["reason"], ended["reason"]
    wait_until(
        lambda: applied(cluster) == dict.fromkeys(SHAPE.hosts, first.id),
        what="every node back on the previous version",
    )
