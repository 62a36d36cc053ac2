"""Benchmarks and probes of real gloo agents over shaped links: what loopback cannot show.

- probes recover the configured bandwidth matrix, each link's rate in absolute terms;
- on two racks behind a slow shared spine, ``topo-tune init`` proves a ring order that crosses the spine
  twice against the natural one that crosses it on every hop, and that ring reaches its slowest link's bound;
- a link cut in the middle of a job ends it cleanly at its deadline and the agents take work again
  once the link is back; an agent killed in the middle of a job fails that job, not the next one, and one
  killed in the middle of a study's trial fails that trial, and the study goes on to finish.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.netns.conftest import ClusterFactory
from tests.support.netns import ClusterShape, NetnsCluster
from tests.support.waiting import wait_until

pytestmark = pytest.mark.netns

TOLERANCE = 0.15
TCP_GOODPUT = (1500 - 52) / (1500 + 14)
"""Payload per frame the shaper counts: a 1448-byte TCP segment (timestamps on) in a 1514-byte Ethernet frame."""
SUCCEEDED = "succeeded"
RUNNING = "running"


LOST_PEER = ("restarted", "Connection reset by peer", "Connection closed by peer")
"""How a job says one of its nodes' agents was killed under it."""


def gbytes(mbit: float) -> float:
    """Mbit/s (as tc counts) in GB/s (as the benchmarks report)."""
    return mbit / 8 / 1000


def bench(cluster: NetnsCluster, nodes: list[str], *args: str, timeout: float = 120) -> dict[str, Any]:
    """``admin bench run`` of an all_reduce on ``nodes`` in that rank order; the job as JSON."""
    done = cluster.admin("bench", "run", "--nodes", ",".join(nodes), "--ranks-per-node", "1", *args, timeout=timeout)
    assert done.stdout, done.stderr
    job: dict[str, Any] = json.loads(done.stdout)
    return job


def busbw(job: dict[str, Any]) -> float:
    assert job["status"] == SUCCEEDED, job["message"]
    return max(float(size["busbw_gbps"]) for size in job["sizes"])


def started(cluster: NetnsCluster, nodes: list[str], *args: str) -> str:
    """Start a job on two nodes without waiting; its id once its ranks exchange data (1 MB on the link)."""
    first, second = nodes
    before = cluster.sent_bytes(first, second)
    job = bench(cluster, nodes, "--no-wait", *args)
    wait_until(lambda: cluster.sent_bytes(first, second) > before + 1_000_000, what="the ranks' traffic", interval=0.1)
    return str(job["job_id"])


def moment(stamp: str) -> datetime:
    """A timestamp of the admin JSON output (RFC 3339, as protobuf writes it)."""
    return datetime.fromisoformat(stamp)


def job_status(cluster: NetnsCluster, job_id: str) -> dict[str, Any]:
    job = cluster.admin_json("bench", "show", job_id)
    assert isinstance(job, dict)
    return job


def ended(cluster: NetnsCluster, job_id: str) -> dict[str, Any]:
    job: dict[str, Any] = wait_until(
        lambda: (found := job_status(cluster, job_id))["status"] != RUNNING and found,
        what=f"job {job_id} to end",
        timeout=60,
        interval=0.2,
    )
    return job


def test_probes_recover_the_bandwidth_matrix(make_cluster: ClusterFactory, sqlite_url: str) -> None:
    shape = ClusterShape(
        racks={"r1": ["a", "b"], "r2": ["c"]},
        rack_mbit=400,
        cross_rack_mbit=200,
        pair_mbit={frozenset(("a", "c")): 100},
    )
    cluster = make_cluster(shape)
    cluster.start_controller(sqlite_url)
    cluster.start_agents()
    probed = cluster.admin("probe", "run", "--size", "1M", "--pair-deadline", "60", timeout=180)
    assert probed.returncode == 0, probed.stderr
    pairs = cluster.admin_json("probe", "pairs")
    assert isinstance(pairs, list)
    measured = {frozenset((p["node_a"], p["node_b"])): float(p["bandwidth_gbps"]) for p in pairs}
    assert sorted(map(sorted, measured)) == [["a", "b"], ["a", "c"], ["b", "c"]]
    # In absolute terms: each pair's figure is one direction of its link (the slower), as TCP goodput.
    for pair, gbps in measured.items():
        configured = gbytes(shape.path_mbit(*sorted(pair))) * TCP_GOODPUT
        assert abs(gbps - configured) <= TOLERANCE * configured, f"{sorted(pair)}: {gbps:.4f} GB/s vs {configured:.4f}"


def test_init_finds_the_ring_that_crosses_a_slow_spine_twice(
    make_cluster: ClusterFactory, sqlite_url: str, tmp_path: Path
) -> None:
    # Sorted host names alternate between the racks, so the launcher's natural order crosses on every hop.
    shape = ClusterShape(racks={"r1": ["node-1", "node-3"], "r2": ["node-2", "node-4"]}, rack_mbit=400, spine_mbit=100)
    cluster = make_cluster(shape)
    cluster.start_controller(sqlite_url)
    cluster.start_agents()
    natural = sorted(shape.hosts)
    assert crossings(shape, natural) == 4

    config = tmp_path / "cluster.yaml"
    config.write_text(CLUSTER_YAML.format(controller=cluster.controller_address))
    output = tmp_path / "out"
    command = [sys.executable, "-m", "topo_tune", "init", "--cluster-config", str(config), "--output", str(output)]
    done = cluster.run_in("controller", command, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((output / "summary.json").read_text())

    assert summary["result"] == "promote", summary["buckets"]
    chosen = summary["chosen"]["node_order"]
    assert crossings(shape, chosen) == 2, f"the chosen ring {chosen} crosses the spine {crossings(shape, chosen)} times"
    (bucket,) = summary["buckets"]
    assert bucket["speedup"] >= 1.5, bucket  # interleaved A/B repeats against the natural order
    ranks = json.loads((output / "rankmap.json").read_text())["ranks"]
    assert [r["node"] for r in ranks] == chosen

    # The chosen ring runs at the bound of its slowest link: the spine, crossed once each way. A large
    # message over several iterations, so the workers' start-up and the token bucket's burst on a busy
    # 2-core host weigh little against the time on the link.
    tuned = busbw(bench(cluster, chosen, "-b", "8M", "-e", "8M", "-n", "4", "-w", "1", "--out-of-place-only"))
    bound = gbytes(shape.spine_mbit or 0) * TCP_GOODPUT
    assert tuned >= (1 - TOLERANCE) * bound, f"{tuned:.4f} GB/s, bound {bound:.4f} GB/s"


CLUSTER_YAML = """\
apiVersion: topo-tune/v1
kind: Cluster
metadata: {{name: netns}}
controller: {{address: "{controller}"}}
backend: gloo
racks:
  - {{name: r1, nodes: [{{name: node-1, gpus: 1}}, {{name: node-3, gpus: 1}}]}}
  - {{name: r2, nodes: [{{name: node-2, gpus: 1}}, {{name: node-4, gpus: 1}}]}}
workload:
  collectives: {{all_reduce: 1}}
search:
  budget: 3
  seed: 0
  minBytes: 2M
  maxBytes: 2M
  finalists: 1
  proofPairs: 4
  iters: 3
  warmupIters: 1
  jobDeadline: 60s
"""


def crossings(shape: ClusterShape, order: list[str]) -> int:
    return sum(shape.rack_of(x) != shape.rack_of(y) for x, y in zip(order, order[1:] + order[:1], strict=True))


def test_a_cut_link_times_a_job_out_and_a_killed_agent_fails_one_job_and_one_trial_but_nothing_next(
    make_cluster: ClusterFactory, sqlite_url: str
) -> None:
    shape = ClusterShape(racks={"r1": ["a", "b"]}, rack_mbit=100)
    cluster = make_cluster(shape)
    cluster.start_controller(sqlite_url)
    cluster.start_agents()
    # The control: this job fits its deadline when nothing goes wrong (about 2 s of traffic).
    job = ["-b", "2M", "-e", "2M", "-n", "6", "-w", "0", "--out-of-place-only", "--deadline", "10"]
    # The same job where only its success matters: a deadline that fresh workers on a busy machine also meet.
    again = [*job[:-1], "60"]
    assert bench(cluster, ["a", "b"], *job)["status"] == SUCCEEDED

    # The link between the two ranks goes down while they exchange data: a clean timeout at the deadline.
    job_id = started(cluster, ["a", "b"], *job)
    cluster.set_link("a", "b", up=False)
    ended_job = ended(cluster, job_id)
    assert ended_job["status"] == "timed_out", ended_job
    assert ended_job["hung_ranks"], "the job names the ranks it killed"
    # By the controller's clock (this test's polls lag on a loaded machine): the agents killed the hung ranks
    # at the deadline and reported them, well before the controller's result grace (15 s) ran out.
    took = (moment(ended_job["finished_at"]) - moment(ended_job["created_at"])).total_seconds()
    assert 10 <= took < 10 + 10, f"ended {took:.1f} s after it was created, deadline 10 s"
    assert cluster.node_states() == {"a": "ready", "b": "ready"}
    assert all(agent.alive() for agent in cluster.agents.values())
    cluster.set_link("a", "b", up=True)
    assert bench(cluster, ["a", "b"], *again)["status"] == SUCCEEDED, "the agents took work again"

    # An agent SIGKILLed while its rank runs: that job fails, the restarted agent takes the next one.
    # (Restarted at once, as a supervisor would, it reports the interrupted command as failed.) About 10 s of
    # traffic, so that the job still runs when this test's lagging polls on a loaded machine get to the kill.
    long_job = ["-b", "2M", "-e", "2M", "-n", "60", "-w", "0", "--out-of-place-only", "--deadline", "40"]
    job_id = started(cluster, ["a", "b"], *long_job)
    cluster.agents["b"].kill()
    cluster.start_agent("b")
    ended_job = ended(cluster, job_id)
    assert ended_job["status"] == "failed", ended_job
    # b's rank dies with its agent (parent-death signal), so which word comes first is a race: a's rank losing
    # its peer, or b's restarted agent reporting the interrupted command.
    assert any(why in ended_job["message"] for why in LOST_PEER), ended_job["message"]
    # The job can end (a's rank lost its peer) before b's restarted agent has registered again.
    wait_until(lambda: cluster.nodes()["b"]["registrations"] == 2, what="b's restarted agent", timeout=60)
    assert bench(cluster, ["a", "b"], *again)["status"] == SUCCEEDED

    # The same in a study the controller runs: past the baseline, SIGKILL b's agent while a search trial's
    # ranks run (a supervisor restarts it at once): that trial fails with the reason, the study finishes.
    study = ["--id", "st-kill", "--budget", "4", "--min-bytes", "1M", "--max-bytes", "1M"]
    cluster.admin_json("study", "start", *study, "--finalists", "1", "--proof-pairs", "2")
    wait_until(
        lambda: (info := study_info(cluster, "st-kill"))["phase"] == "search" and info["done"] >= 1,
        what="the baseline trial",
        timeout=120,
        interval=0.2,
    )
    # After the baseline, the next traffic between the two ranks is a search trial's. (Its ranks may run in the
    # baseline's kept workers: a trial's NCCL settings need no fresh process on gloo, which reads none of them.)
    before = cluster.sent_bytes("a", "b")
    wait_until(
        lambda: cluster.sent_bytes("a", "b") > before + 1_000_000,
        what="a trial's ranks exchanging data",
        timeout=60,
        interval=0.05,
    )
    cluster.agents["b"].kill()
    cluster.start_agent("b")

    info = wait_until(
        lambda: (found := study_info(cluster, "st-kill"))["status"] != "running" and found,
        what="the study to end",
        timeout=240,
        interval=0.2,
    )
    assert info["status"] == "succeeded", info
    trials = cluster.admin_json("study", "trials", "st-kill")
    assert isinstance(trials, dict)
    failed = [t for t in trials["trials"] if t["state"] not in ("complete", "pruned")]
    assert len(failed) == 1, trials
    assert failed[0]["state"] == "failed" and any(why in failed[0]["reason"] for why in LOST_PEER), failed
    later = [t for t in trials["trials"] if t["number"] > failed[0]["number"] and t["state"] == "complete"]
    assert later, f"no trial completed after the failed one: {trials}"
    assert cluster.nodes()["b"]["registrations"] == 3


def study_info(cluster: NetnsCluster, study_id: str) -> dict[str, Any]:
    info = cluster.admin_json("study", "status", study_id)
    assert isinstance(info, dict)
    return info
