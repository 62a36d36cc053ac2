"""A Kubernetes job asks for its order with only its Job's or JobSet's uid: a controller in Kubernetes mode reads the
pods from the API double, waits for them to be scheduled, and answers; the job's image needs no kubectl."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests.conftest import controller_settings
from tests.kube.conftest import KubeEnvFactory
from tests.kube.fake_apiserver import FakeApiServer
from tests.support.processes import TOKEN
from tests.support.waiting import async_wait_until
from topo_tune.cli.main import cli
from topo_tune.client.admin import AdminClient
from topo_tune.controller.server import Controller
from topo_tune.errors import ConflictError, NotFoundError, ValidationError

JOB_UID = "0b3c7a52-6d1e-4f1a-9d0e-2c8f5a7e9b01"
JOBSET_UID = "7f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0"


@pytest.fixture
async def kube_controller(sqlite_url: str, kube_env: KubeEnvFactory) -> AsyncIterator[Controller]:
    controller = Controller(controller_settings(sqlite_url, kubernetes=kube_env("controller")))
    await controller.start()
    try:
        yield controller
    finally:
        await controller.stop()


def job_pod(apiserver: FakeApiServer, name: str, node: str) -> None:
    labels = {"batch.kubernetes.io/controller-uid": JOB_UID, "batch.kubernetes.io/job-name": "train"}
    apiserver.add_pod("ml", name, node=node, phase="Running" if node else "Pending", labels=labels)


def env(controller: Controller, node: str, tmp_path: Path) -> Result:
    args = ["env", "--controller", f"127.0.0.1:{controller.port}", "--job-id", JOB_UID, "--node", node]
    return CliRunner().invoke(cli, [*args, "--config-dir", str(tmp_path)], env={"TOPO_TUNE_TOKEN": TOKEN})


async def test_env_with_only_the_jobs_uid_waits_for_its_pods_and_gets_the_order(
    kube_controller: Controller, apiserver: FakeApiServer, tmp_path: Path
) -> None:
    apiserver.add_job("ml", "train", uid=JOB_UID, parallelism=3, completions=3)
    job_pod(apiserver, "train-0", "gpu-b")
    job_pod(apiserver, "train-1", "gpu-a")
    job_pod(apiserver, "train-2", "")  # not scheduled yet
    asked = asyncio.create_task(asyncio.to_thread(env, kube_controller, "gpu-b", tmp_path))

    def pod_lists() -> int:
        return sum("labelSelector=batch.kubernetes.io" in path for _, path, _ in apiserver.requests)

    async def listed_twice() -> bool:
        return pod_lists() >= 2  # the controller saw 2 of 3 scheduled and is waiting

    await async_wait_until(listed_twice, timeout=20, what="the controller to list the job's pods while waiting")
    assert not asked.done(), "no answer while a pod is unscheduled"
    apiserver.bind_pod("ml", "train-2", "gpu-c")
    printed = await asyncio.wait_for(asked, 30)
    assert printed.exit_code == 0, printed.output
    lines = printed.stdout.splitlines()
    assert "export TOPO_TUNE_NNODES=3" in lines and f"export TOPO_TUNE_JOB_ID={JOB_UID}" in lines
    (order,) = [line.removeprefix("export TOPO_TUNE_NODE_ORDER=") for line in lines if "NODE_ORDER=" in line]
    assert sorted(order.split(",")) == ["gpu-a", "gpu-b", "gpu-c"]
    assert f"export TOPO_TUNE_NODE_RANK={order.split(',').index('gpu-b')}" in lines
    # As the init-container pattern uses it (docs/kubernetes.md): the training container sources the file.
    sourced = await asyncio.to_thread(_sourced, printed.stdout, tmp_path / "env")
    assert sourced.split() == [str(order.split(",").index("gpu-b")), "3", "/dev/null"], "NCCL's defaults"

    # Another pod of the job: the pinned nodes answer, with no API call.
    before = pod_lists()
    again = await asyncio.to_thread(env, kube_controller, "gpu-c", tmp_path)
    assert again.exit_code == 0, again.output
    assert f"export TOPO_TUNE_NODE_ORDER={order}" in again.stdout.splitlines()
    assert pod_lists() == before


async def test_a_jobset_whose_pods_are_not_all_scheduled_is_refused_in_bounded_time(
    kube_controller: Controller, apiserver: FakeApiServer
) -> None:
    apiserver.add_jobset("ml", "big", uid=JOBSET_UID, replicated=[(2, 1), (1, 2)])  # 2×1 + 1×2 = 4 pods
    labels = {"jobset.sigs.k8s.io/jobset-uid": JOBSET_UID, "jobset.sigs.k8s.io/jobset-name": "big"}
    for index, node in enumerate(["n1", "n2", "n3", ""]):
        apiserver.add_pod("ml", f"big-{index}", node=node, phase="Running" if node else "Pending", labels=labels)
    with AdminClient(f"127.0.0.1:{kube_controller.port}", token=TOKEN) as client:
        with pytest.raises(ConflictError, match=r"JobSet ml/big\): 3 of 4 pods scheduled after 1 s \(waiting: big-3\)"):
            await asyncio.to_thread(client.resolve_job_config, JOBSET_UID, [], schedule_wait_s=1)
        with pytest.raises(NotFoundError, match="no pod of a Job or JobSet with this uid"):
            await asyncio.to_thread(client.resolve_job_config, JOB_UID, [], schedule_wait_s=1)
        apiserver.bind_pod("ml", "big-3", "n4")
        config = await asyncio.to_thread(client.resolve_job_config, JOBSET_UID, [], schedule_wait_s=1)
    assert sorted(config.node_order) == ["n1", "n2", "n3", "n4"]


async def test_outside_kubernetes_a_job_must_name_its_nodes(controller: Controller, tmp_path: Path) -> None:
    refusal = "only a controller in Kubernetes mode looks a job's nodes up"
    address = f"127.0.0.1:{controller.port}"
    with AdminClient(address, token=TOKEN) as client, pytest.raises(ValidationError, match=refusal):
        await asyncio.to_thread(client.resolve_job_config, JOB_UID, [])
    # A job id that is no Kubernetes uid never leaves its nodes to the controller.
    args = ["env", "--controller", address, "--job-id", "run-42", "--node", "a"]
    refused = await asyncio.to_thread(CliRunner().invoke, cli, args, env={"TOPO_TUNE_TOKEN": TOKEN})
    assert refused.exit_code == 2 and "no nodes: pass --nodes HOSTS" in refused.output


def _sourced(text: str, path: Path) -> str:
    path.write_text(text)
    script = '. "$0" && echo "$TOPO_TUNE_NODE_RANK $TOPO_TUNE_NNODES $NCCL_CONF_FILE"'
    env = {"PATH": os.environ["PATH"]}
    return subprocess.run(["sh", "-c", script, path], capture_output=True, text=True, check=True, env=env).stdout
