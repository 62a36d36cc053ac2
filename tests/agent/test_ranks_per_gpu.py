"""The agent's ``--ranks-per-gpu N`` mode: refused without an NCCL that allows it; ranks placed N to a GPU.

The workers here are a small script standing in for the interpreter the launcher starts (as in
``test_launcher_faults``): it reports the device, CPUs and NCCL variables the launcher handed it, so the
placement is checked without a GPU. The NCCL versions are the ones seen on the H200 record: torch 2.11's own
2.28.9 (refuses several ranks on one GPU) and 2.30.7 built from source (runs them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from topo_tune.agent.bench.launcher import Launcher
from topo_tune.agent.bench.ranks_per_gpu import refusal, shared_gpu_env
from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.results import RankOutcome
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.controller.api import validation
from topo_tune.controller.benchmarks.plan import JobNode, plan_job
from topo_tune.errors import ValidationError
from topo_tune.nccl.backends import Backend
from topo_tune.nccl.collectives import Collective
from topo_tune.topology.gpu_ranks import gpu_ranks
from topo_tune.v1 import agent_pb2, topology_pb2

_REPORTING_WORKER = """\
import json, os, sys
config = json.load(open(sys.argv[-1]))
seen = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
json.dump({"device": config["device"], "cpus": config["cpus"], "env": seen},
          open(os.path.join(os.path.dirname(config["result_path"]), "seen.json"), "w"))
json.dump({"job_id": config["spec"]["job_id"], "rank": config["rank"], "sizes": [], "effective_env": {}},
          open(config["result_path"], "w"))
"""


@pytest.mark.parametrize(
    ("backend", "version", "says"),
    [
        (Backend.GLOO, "2.30.7", "needs --backend nccl (got gloo)"),
        (Backend.NCCL, "2.28.9", "that NCCL is 2.28.9, which refuses several ranks on one GPU"),
        (Backend.NCCL, None, "no libnccl was found to ask"),
        (Backend.NCCL, "2.3", "that NCCL is 2.3,"),
    ],
)
def test_the_mode_is_refused_unless_the_workers_nccl_allows_it(
    backend: Backend, version: str | None, says: str
) -> None:
    assert says in refusal(2, backend=backend, nccl_version=version)
    assert refusal(1, backend=backend, nccl_version=version) == ""  # one rank a GPU needs nothing


def test_an_nccl_of_2_30_or_later_allows_it() -> None:
    assert refusal(4, backend=Backend.NCCL, nccl_version="2.30.7") == ""
    assert refusal(4, backend=Backend.NCCL, nccl_version="3.0.1") == ""


def test_a_node_reporting_n_ranks_per_gpu_gets_n_ranks_on_each_gpu_and_too_many_are_refused() -> None:
    topology = topology_pb2.NodeTopology(gpus=[topology_pb2.Gpu(index=0), topology_pb2.Gpu(index=1)])
    assert gpu_ranks(topology) == 2
    topology.ranks_per_gpu = 3
    assert gpu_ranks(topology) == 6
    message = agent_pb2.Register(node_name="n0", topology=topology, backend=agent_pb2.BACKEND_NCCL)
    message.topology.ranks_per_gpu = 9
    with pytest.raises(ValidationError) as refused:
        validation.register(message)
    assert refused.value.field == "register.topology.ranks_per_gpu"


def test_the_launcher_places_n_ranks_on_each_gpu_with_the_switch_on_and_channels_capped(tmp_path: Path) -> None:
    # The controller's plan for a node reporting 2 GPUs x 2 ranks: four ranks on device slots 0..3.
    spec = plan_job(
        job_id="shared-1",
        collective=Collective.ALL_REDUCE,
        sweep=SizeSweep(1024, 1024, 1),
        dtype=dtype_named("float32"),
        nodes=[JobNode(name="n0", address="127.0.0.1", slots=4)],
        rendezvous_port=29500,
        env={"NCCL_MAX_NCHANNELS": "100", "NCCL_MIN_NCHANNELS": "8"},
        gpu_devices=True,
    )
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!{sys.executable}\n{_REPORTING_WORKER}")
    fake.chmod(0o755)
    launcher = Launcher(backend=Backend.NCCL, python=str(fake), ranks_per_gpu=2, cpus_for_device={0: (0,), 1: (1,)})
    outcome = launcher.run(spec, node_name="n0", deadline_s=30, work_dir=tmp_path / "work")
    assert [s.outcome for s in outcome.statuses] == [RankOutcome.FINISHED] * 4
    seen = [json.loads((tmp_path / "work" / "shared-1" / f"rank-{r}" / "seen.json").read_text()) for r in range(4)]
    assert [s["device"] for s in seen] == [0, 0, 1, 1]
    assert [s["cpus"] for s in seen] == [[0], [0], [1], [1]]
    for s in seen:
        assert s["env"]["NCCL_MULTI_RANK_GPU_ENABLE"] == "1"
        assert s["env"]["NCCL_MAX_NCHANNELS"] == "64"  # the job's 100 capped at 128 / 2
        assert s["env"]["NCCL_MIN_NCHANNELS"] == "8"


def test_one_rank_a_gpu_leaves_the_environment_as_the_job_set_it() -> None:
    env = {"NCCL_MAX_NCHANNELS": "100"}
    assert shared_gpu_env(env, 1) == env
    assert shared_gpu_env({}, 4) == {"NCCL_MULTI_RANK_GPU_ENABLE": "1", "NCCL_MAX_NCHANNELS": "32"}
    assert shared_gpu_env({"NCCL_MIN_NCHANNELS": "40"}, 4)["NCCL_MIN_NCHANNELS"] == "32"
