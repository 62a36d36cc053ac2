"""A real job's gain: a PyTorch DDP training job's step time in the tuned node order against the launcher's.

Builds a cluster of network namespaces (``tests/support/netns.py``): six hosts ``h1``..``h6``, one link per
pair shaped with ``tbf``. The launcher's order (sorted host names) rings over slow links (``--slow-mbit``),
a hidden ring ``h1 h3 h5 h2 h6 h4`` over fast ones (``--fast-mbit``), every other pair in between
(``--mid-mbit``). The real controller runs in its namespace and a real gloo agent in each host's; then:

1. ``topo-tune init`` (backend gloo, against that controller) probes the pairs, searches and proves a
   config version (settings and rank order) against NCCL's defaults on its all_reduce micro-benchmark;
2. ``admin rollout create`` rolls that version out in one wave over every host, and its gate must pass
   (the gate measures the version's order against the launcher's);
3. the training job, ``examples/ddp_step_time.py`` (a two-layer MLP whose gradients are ``--grad-mib``
   MiB, all-reduced by DDP over gloo every step), is started on every host under
   ``topo-tune exec --compare stable --against defaults``: interleaved runs of the stable version (its
   order) and NCCL's defaults (the launcher's order), each run printing its median step time.

It prints, side by side, the job's step time per arm, their ratio with its confidence interval (the job's own
A/B, as ``admin job comparisons`` lists it) and the gain the tuner predicted from its micro-benchmark (its
proof's speedup and the rank map's predicted ring bottlenecks). Target: the tuned job's step time at most half
the launcher-order job's. ``--record FILE`` appends the table with the command line. Needs root; the
namespaces and every process in them are removed at the end, also on failure.

Run: ``sudo .venv/bin/python benchmarks/job_gain.py [--pairs 3] [--record benchmarks/results/job-gain.md]``.
Non-goals: GPUs and NCCL (gloo's ring follows the rank order as NCCL's inter-node ring does), latency shaping
(no ``netem``), the job's statistics (``exec --compare`` computes them).
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.support.netns import ClusterShape, NetnsCluster
from tests.support.processes import cli_env
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
TRAINING = REPO / "examples" / "ddp_step_time.py"
HOSTS = [f"h{i}" for i in range(1, 7)]
HIDDEN_RING = ["h1", "h3", "h5", "h2", "h6", "h4"]
METRIC = r"step_time_ms: ([0-9.]+)"
TARGET_RATIO = 0.5
GATES = [
    "--no-canary", "--gate-repeats", "4", "--gate-min-bytes", "2M", "--gate-max-bytes", "2M",
    "--gate-iters", "3", "--gate-warmup-iters", "1",
    # Four pairs can reach p < 0.1; CPU workers on a shared machine are noisier than a GPU fabric.
    "--threshold", "alpha=0.1", "--threshold", "max_cv=0.3", "--threshold", "max_p99_regression=0.5",
]  # fmt: skip

CLUSTER_YAML = """\
apiVersion: topo-tune/v1
kind: Cluster
metadata: {{name: job-gain}}
controller: {{address: "{controller}"}}
backend: gloo
racks:
  - {{name: r1, nodes: [{nodes}]}}
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
  jobDeadline: 120s
"""


def ring_pairs(order: list[str]) -> set[frozenset[str]]:
    return {frozenset((order[i], order[(i + 1) % len(order)])) for i in range(len(order))}


def shape(*, slow: float, fast: float, mid: float) -> ClusterShape:
    launcher, hidden = ring_pairs(sorted(HOSTS)), ring_pairs(HIDDEN_RING)
    rates = {}
    for a, b in itertools.combinations(HOSTS, 2):
        pair = frozenset((a, b))
        rates[pair] = slow if pair in launcher else fast if pair in hidden else mid
    return ClusterShape(racks={"r1": HOSTS}, rack_mbit=mid, pair_mbit=rates)


def step(what: str) -> float:
    print(f"# {datetime.now(UTC):%H:%M:%S} {what}", file=sys.stderr, flush=True)
    return time.monotonic()


def init(cluster: NetnsCluster, workdir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``topo-tune init`` against the controller in its namespace: summary.json and rankmap.json."""
    config = workdir / "init.yaml"
    nodes = ", ".join(f"{{name: {h}, gpus: 1}}" for h in HOSTS)
    config.write_text(CLUSTER_YAML.format(controller=cluster.controller_address, nodes=nodes))
    output = workdir / "init-out"
    argv = [sys.executable, "-m", "topo_tune", "init", "--cluster-config", str(config), "--output", str(output)]
    done = cluster.run_in("controller", argv, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"topo-tune init exited {done.returncode}: {done.stderr[-2000:]}")
    summary = json.loads((output / "summary.json").read_text())
    rank_map = json.loads((output / "rankmap.json").read_text())
    return summary, rank_map


def roll_out(cluster: NetnsCluster, version: str) -> dict[str, Any]:
    """Roll ``version`` out over every host; the completed rollout (its gate passed)."""
    cluster.admin_json("rollout", "create", version, "--id", "ro-job-gain", "--yes", *GATES, timeout=120)

    def ended() -> dict[str, Any]:
        info = cluster.admin_json("rollout", "status", "ro-job-gain")
        assert isinstance(info, dict)
        return info if info["phase"] in ("completed", "rolled_back", "aborted", "paused") else {}

    info = wait_until(ended, what="the rollout to end", timeout=900, interval=1.0)
    if info["phase"] != "completed":
        raise SystemExit(f"the rollout ended {info['phase']}: {info.get('reason')}; gates: {info.get('gates')}")
    return info


def train(cluster: NetnsCluster, *, job_id: str, pairs: int, grad_mib: float, steps: int) -> list[str]:
    """The DDP job on every host under ``exec --compare stable --against defaults``; each host's output."""
    procs = []
    for host in HOSTS:
        command = [sys.executable, str(TRAINING), "--bind", cluster.address(host)]
        command += ["--grad-mib", str(grad_mib), "--steps", str(steps)]
        argv = [
            sys.executable, "-m", "topo_tune", "exec", "--controller", cluster.controller_address,
            "--compare", "stable", "--against", "defaults", "--pairs", str(pairs), "--metric", METRIC,
            "--job-id", job_id, "--nodes", ",".join(HOSTS), "--config-dir", str(cluster.config_dir),
            "--", *command,
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(
                cluster.on_node(host, argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=cli_env(TOPO_TUNE_NODE_NAME=host),
            )
        )
    outputs = [proc.communicate(timeout=3600)[0] for proc in procs]
    failed = [(h, p.returncode, out) for h, p, out in zip(HOSTS, procs, outputs, strict=True) if p.returncode]
    if failed:
        host, code, out = failed[0]
        raise SystemExit(f"exec --compare on {host} exited {code}:\n{out[-3000:]}")
    return outputs


def comparison(cluster: NetnsCluster, job_id: str) -> dict[str, Any]:
    """The job's own A/B as the controller stores it (``admin job comparisons``)."""
    listed = cluster.admin_json("job", "comparisons", "--job-id", job_id)
    assert isinstance(listed, list)
    complete = [c for c in listed if c["complete"]]
    if not complete:
        raise SystemExit(f"the controller holds no complete comparison of job {job_id}: {listed}")
    result: dict[str, Any] = complete[0]
    return result


def table(
    *, summary: dict[str, Any], rank_map: dict[str, Any], compared: dict[str, Any], args: argparse.Namespace
) -> str:
    (bucket,) = summary["buckets"]
    planned, naive = rank_map["planned"], rank_map["naive"]
    predicted = naive["ring_bottleneck_gbps"] / planned["ring_bottleneck_gbps"]
    job = compared["job"]
    # The comparison's gain is the launcher-order run's step time over the tuned one's; its inverse is the ratio.
    ratio, low, high = 1 / compared["gain"], 1 / compared["ci_high"], 1 / compared["ci_low"]
    level = f"{compared['confidence']:.0%}"
    lines = [
        f"6 network-namespace hosts, gloo, 2 CPUs; launcher ring {args.slow_mbit:g} Mbit/s, hidden ring "
        f"{args.fast_mbit:g} Mbit/s, other pairs {args.mid_mbit:g} Mbit/s; DDP MLP, {args.grad_mib:g} MiB gradients, "
        f"{args.steps} timed steps per run, {args.pairs} interleaved pairs of runs",
        "| | launcher order (--against defaults) | tuned order (--compare stable) | tuned / launcher |",
        "|---|---|---|---|",
        f"| node order | {','.join(job['against_order'])} | {','.join(job['candidate_order'])} | |",
        f"| DDP step time, ms (the job's own A/B; median of runs) | {compared['against_median']:.1f} | "
        f"{compared['candidate_median']:.1f} | {ratio:.3f} ({level} CI {low:.3f}-{high:.3f}; {compared['decision']}) |",
        f"| all_reduce 2 MiB, init's proof against the defaults (micro-benchmark) | | | "
        f"{1 / bucket['speedup']:.3f} (speedup {bucket['speedup']:.2f}x) |",
        f"| ring bottleneck predicted from the probed pairs, GB/s | {naive['ring_bottleneck_gbps']:.4f} | "
        f"{planned['ring_bottleneck_gbps']:.4f} | {predicted:.3f} |",
        f"target: tuned step time <= {TARGET_RATIO} x the launcher order's: "
        f"{'met' if high <= TARGET_RATIO else 'not met'} (ratio {ratio:.3f}, CI upper bound {high:.3f})",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow-mbit", type=float, default=50.0)
    parser.add_argument("--fast-mbit", type=float, default=400.0)
    parser.add_argument("--mid-mbit", type=float, default=100.0)
    parser.add_argument("--grad-mib", type=float, default=4.0)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=3, help="interleaved pairs of training runs")
    parser.add_argument("--record", type=Path, help="append the table, with the command, to this file")
    parser.add_argument("--workdir", type=Path, help="keep logs here (default: a temporary directory)")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="job-gain-"))
    started = step(f"building the cluster in {workdir}")
    with NetnsCluster(shape(slow=args.slow_mbit, fast=args.fast_mbit, mid=args.mid_mbit), workdir) as cluster:
        try:
            cluster.start_controller(f"sqlite:///{workdir / 'controller.db'}")
            cluster.start_agents()
            step("topo-tune init (probe, study, proof)")
            summary, rank_map = init(cluster, workdir)
            version = summary["config_version"]
            if summary["result"] != "promote":
                raise SystemExit(f"init kept NCCL's defaults: {summary.get('buckets')}")
            step(f"rolling out {version}")
            rolled = roll_out(cluster, version)
            step("the DDP job under exec --compare stable --against defaults")
            job_id = f"job-gain-{int(time.time())}"
            outputs = train(cluster, job_id=job_id, pairs=args.pairs, grad_mib=args.grad_mib, steps=args.steps)
            compared = comparison(cluster, job_id)
        except BaseException:
            print(cluster.logs(), file=sys.stderr)
            raise
    elapsed = time.monotonic() - started
    step(f"done in {elapsed:.0f} s")
    for host, output in zip(HOSTS, outputs, strict=True):
        print(f"--- {host}\n{output.strip()[-1500:]}", file=sys.stderr)
    result = table(summary=summary, rank_map=rank_map, compared=compared, args=args)
    gates = "; ".join(f"{g['outcome']}: {' '.join(g['reasons'])}" for g in rolled["gates"])
    result += f"\nrollout gate (the version and its order against the defaults in the launcher's order): {gates}"
    print(result)
    if args.record is not None:
        shown = [
            "DIR" if prev == "--workdir" else a for prev, a in zip(["", *sys.argv[1:]], sys.argv[1:], strict=False)
        ]
        command = " ".join(shlex.quote(a) for a in ["python", "benchmarks/job_gain.py", *shown])
        with args.record.open("a") as record:
            record.write(f"\n## {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n\nCommand: `{command}` (as root), ")
            record.write(f"{elapsed:.0f} s from building the cluster to the table.\n\n")
            record.write(f"```\n{result}\n```\n")


if __name__ == "__main__":
    main()
