"""The harness itself: shaped links measure their configured rate, a shared spine is shared, nothing can
leave the namespaces, and teardown leaves no namespace, veth or process behind, even after a failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.netns.conftest import ClusterFactory
from tests.support.netns import ClusterShape, NetnsCluster, namespaces_of_runs, pids_in
from tests.support.transfer import aggregate_mbit, measure

pytestmark = pytest.mark.netns

TOLERANCE = 0.15


def within(measured: float, configured: float) -> bool:
    return abs(measured - configured) <= TOLERANCE * configured


def test_each_pair_gets_its_own_link_at_its_own_rate(make_cluster: ClusterFactory) -> None:
    shape = ClusterShape(racks={"r1": ["a", "b", "c"]}, rack_mbit=400, pair_mbit={frozenset(("a", "c")): 50})
    cluster = make_cluster(shape)
    for source, destination in [("a", "b"), ("b", "c"), ("c", "a"), ("a", "c")]:
        configured = shape.path_mbit(source, destination)
        (flow,) = measure(cluster, [(source, destination)])
        assert within(flow.mbit, configured), (
            f"{source}->{destination}: {flow.mbit:.1f} Mbit/s, configured {configured}"
        )
    # Two pairs at once do not slow each other: each has its own veth.
    fast, slow = measure(cluster, [("a", "b"), ("c", "a")])
    assert within(fast.mbit, 400), fast
    assert within(slow.mbit, 50), slow


def test_a_shared_spine_is_shared_by_the_flows_between_two_racks(make_cluster: ClusterFactory) -> None:
    shape = ClusterShape(racks={"r1": ["a", "b"], "r2": ["c", "d"]}, rack_mbit=400, spine_mbit=100)
    cluster = make_cluster(shape)
    (inside,) = measure(cluster, [("a", "b")])
    (across,) = measure(cluster, [("b", "d")])
    assert within(inside.mbit, 400), inside
    assert within(across.mbit, 100), across
    # Two flows from rack r1 to rack r2 at once split the one spine link between them.
    flows = measure(cluster, [("a", "c"), ("b", "d")])
    assert within(aggregate_mbit(flows), 100), flows
    assert all(flow.mbit < 80 for flow in flows), flows


def test_nothing_is_routed_out_of_the_namespaces(make_cluster: ClusterFactory) -> None:
    shape = ClusterShape(racks={"r1": ["a"], "r2": ["b"]}, spine_mbit=100)
    cluster = make_cluster(shape)
    for host in ["controller", "a", "b"]:
        routes = cluster.run_in(host, ["ip", "-4", "route", "show"]).stdout
        assert "default" not in routes, routes
        for line in routes.splitlines():
            assert line.startswith("198.18."), f"{host} routes outside the harness's block: {line}"
        # The kernel answers without sending anything: there is no route to any address we did not assign.
        outside = cluster.run_in(host, ["ip", "route", "get", "192.0.2.1"])
        assert outside.returncode != 0 and "unreachable" in outside.stderr, outside


def running(pid: int) -> bool:
    """Still there and not a zombie (a killed orphan is reaped by init a moment later)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_teardown_leaves_nothing_behind_even_when_the_test_fails(tmp_path: Path, sqlite_url: str) -> None:
    shape = ClusterShape(racks={"r1": ["a", "b"], "r2": ["c"]}, spine_mbit=100)
    links_before = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    cluster = NetnsCluster(shape, tmp_path)
    pids: list[int] = []
    with pytest.raises(RuntimeError, match="the test failed here"), cluster:
        cluster.start_controller(sqlite_url)
        cluster.start_agents()
        # A process the harness did not start itself (as a benchmark worker would be), orphaned on purpose.
        orphan = "import subprocess; subprocess.Popen(['sleep', '300'], stdout=-3, stderr=-3, start_new_session=True)"
        assert cluster.run_in("b", [sys.executable, "-c", orphan]).returncode == 0
        pids = [pid for host in ["controller", *shape.hosts] for pid in pids_in(cluster.exec_argv(host, [])[3])]
        assert len(pids) >= 5, pids  # controller, three agents, the orphan
        raise RuntimeError("the test failed here")
    assert not [name for name in namespaces_of_runs() if name.startswith(cluster.prefix)]
    for pid in pids:
        assert not running(pid), f"process {pid} outlived the cluster"
    links_after = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert links_after.count("\n") == links_before.count("\n"), links_after
    cluster.close()  # twice is harmless
