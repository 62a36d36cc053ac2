"""Names a controller answers about a job are checked on the client before a launcher, a hostfile or a shell gets
them: a real controller whose stored pin (or a node's stored address) was forged answers a node name with a
newline and a flag, and ``env``, ``hostfile`` and ``exec`` each refuse it with one line naming the controller
and the field, printing and running nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc.aio
import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result
from sqlalchemy.orm import Session

from tests.controller.test_services import open_session, register
from tests.support.processes import TOKEN
from topo_tune.cli.main import cli
from topo_tune.client.job_answer import checked_job_config
from topo_tune.controller.db.models import JobPinRow, NodeRow
from topo_tune.controller.server import Controller
from topo_tune.errors import UnsafeAnswer
from topo_tune.ids import ConfigVersionId, NodeName
from topo_tune.jobs.job_config import JobConfig

JOB = "j-forged"
NODES = "gpu01,gpu03"


async def _run(controller: Controller, *argv: str) -> Result:
    env = {
        "TOPO_TUNE_TOKEN": TOKEN,
        "TOPO_TUNE_CONTROLLER": f"127.0.0.1:{controller.port}",
        "TOPO_TUNE_NODE_NAME": "gpu01",
    }
    return await asyncio.to_thread(CliRunner().invoke, cli, list(argv), env=env, catch_exceptions=False)


LAUNCHER_PATHS: Sequence[Sequence[str]] = [
    ("env", "--job-id", JOB, "--nodes", NODES),
    ("hostfile", "--job-id", JOB, "--nodes", NODES),
    ("exec", "--job-id", JOB, "--nodes", NODES, "--", "true"),
]


def _refused(result: Result, controller: Controller, field: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.stdout == "", "nothing of the answer is printed"
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"topo-tune: error: controller 127.0.0.1:{controller.port} answered {field} = ")


async def test_a_forged_node_name_in_a_pin_is_refused_on_every_launcher_path(controller: Controller) -> None:
    pinned = await _run(controller, "env", "--job-id", JOB, "--nodes", NODES)
    assert pinned.exit_code == 0, pinned.output

    def forge(session: Session) -> None:
        for pin in session.scalars(sa.select(JobPinRow).where(JobPinRow.job_id == JOB)):
            pin.node_order = ["gpu01\ngpu99 slots=64", "gpu03"]

    await controller.db.run(forge)
    for argv in LAUNCHER_PATHS:
        result = await _run(controller, *argv)
        _refused(result, controller, "node_order[0]")
        assert "'gpu01\\ngpu99 slots=64': not a node name" in result.stderr, argv


async def test_a_forged_master_address_is_refused(controller: Controller) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
        calls = [await open_session(channel, register(name, address="10.0.0.1")) for name in NODES.split(",")]
        for call in calls:
            await asyncio.wait_for(call.read(), 10)

        def forge(session: Session) -> None:
            for node in session.scalars(sa.select(NodeRow)):
                node.address = "10.0.0.1 --master_port=1"

        await controller.db.run(forge)
        result = await _run(controller, "env", "--job-id", JOB, "--nodes", NODES)
        _refused(result, controller, "master_addr")
        assert "not a host name or an IP address" in result.stderr
        for call in calls:
            call.cancel()


@pytest.mark.parametrize(
    ("answer", "field"),
    [
        (JobConfig(JOB, nodes=(NodeName("gpu01"), NodeName("-oProxyCommand=x"))), "nodes[1]"),
        (JobConfig(JOB, node_order=(NodeName("a" * 254),)), "node_order[0]"),
        (JobConfig(JOB, node_order=(NodeName("gpu\u202e10"),)), "node_order[0]"),
        (JobConfig(JOB, config_version=ConfigVersionId("cv-1; rm -rf ~")), "config_version"),
        (JobConfig(JOB, files=("../../etc/profile",)), "files[0]"),
    ],
)
def test_each_name_of_an_answer_is_checked(answer: JobConfig, field: str) -> None:
    with pytest.raises(UnsafeAnswer, match=rf"^controller c:1 answered {field.replace('[', '.').replace(']', '.')} = "):
        checked_job_config(answer, controller="c:1")


def test_a_good_answer_passes_unchanged() -> None:
    nodes = (NodeName("gpu-03.rack_1"), NodeName("gpu01"))
    answer = JobConfig(JOB, node_order=nodes, nodes=nodes[::-1], master_addr="fd00::1")
    assert checked_job_config(answer, controller="c:1") is answer
