"""The DDP training example the job-gain benchmark runs: over gloo between namespace hosts, in the order given.

Two hosts, started as ``topo-tune exec`` starts each node's command (node rank, node count and master address
in the environment); each prints its median step time, and the order decides which host holds the rendezvous.
Without the variables the script stops at once, naming the one that is missing.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.netns.conftest import ClusterFactory
from tests.support.netns import ClusterShape
from tests.support.processes import cli_env

pytestmark = pytest.mark.netns

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_step_time.py"


def test_the_ddp_example_trains_over_gloo_in_the_given_node_order(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(ClusterShape(racks={"r1": ["a", "b"]}, rack_mbit=200))
    order = ["b", "a"]  # node rank 0 is b: the rendezvous is on b's address
    procs = {
        host: subprocess.Popen(
            cluster.exec_argv(
                host, [sys.executable, str(EXAMPLE), "--bind", cluster.address(host), "--grad-mib", "1", "--steps", "2"]
            ),
            env=cli_env(
                TOPO_TUNE_NODE_RANK=str(order.index(host)),
                TOPO_TUNE_NNODES="2",
                TOPO_TUNE_MASTER_ADDR=cluster.address(order[0]),
                TOPO_TUNE_NODE_ORDER=",".join(order),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for host in order
    }
    outputs = {host: proc.communicate(timeout=180) for host, proc in procs.items()}
    for host, proc in procs.items():
        assert proc.returncode == 0, f"{host}: {outputs[host][1][-2000:]}"
    assert "rank 0/2: gradients 1.00 MiB, 2 steps, order b,a" in outputs["b"][0]
    assert re.search(r"^step_time_ms: [0-9.]+$", outputs["b"][0], re.MULTILINE), outputs["b"][0]

    missing = subprocess.run(
        [sys.executable, str(EXAMPLE)], env=cli_env(), capture_output=True, text=True, timeout=120, check=False
    )
    assert missing.returncode != 0
    assert "TOPO_TUNE_NODE_RANK is not set" in missing.stderr.strip().splitlines()[-1]
