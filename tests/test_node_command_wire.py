"""Nodes and commands survive the admin API's wire: what the controller's servicers send is what the admin client
hands the CLI (``wire/nodes.py``, ``wire/commands.py``), and ``-o json`` prints the controller's message as it was,
field for field; an operator's drain, undrain and rediscover reach the controller as the bodies it reads."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from topo_tune.command_record import CommandInfo, CommandStatus, NodeCommand
from topo_tune.controller.api.messages import from_proto_command_body, to_proto_command, to_proto_node
from topo_tune.controller.commands import CommandRecord
from topo_tune.controller.nodes import NodeView
from topo_tune.errors import ControllerError
from topo_tune.ids import ConfigVersionId, NodeName
from topo_tune.nccl.backends import Backend
from topo_tune.node_record import NodeInfo, NodeState
from topo_tune.v1 import admin_pb2, agent_pb2, topology_pb2
from topo_tune.wire import commands, nodes
from topo_tune.wire.plain_data import to_data

AT = datetime(2026, 12, 3, 9, 30, 15, 250_000, tzinfo=UTC)
TOPOLOGY = topology_pb2.NodeTopology(hostname="gpu-01", cpu_count=64, memory_bytes=2**40)
VIEW = NodeView(
    name=NodeName("gpu-01"),
    rack="r1",
    state=NodeState.LOST,
    labels={"topology.kubernetes.io/zone": "b", "pool": "a"},
    drained=True,
    activity="drained",
    agent_version="0.9.0",
    backend=Backend.GLOO,
    applied_config_version=ConfigVersionId("cv-0123456789abcdef"),
    topology=TOPOLOGY.SerializeToString(),
    address="10.0.0.1:7001",
    registrations=3,
    registered_at=AT,
    last_heartbeat_at=AT,
    config_damage="nccl.conf does not match its id",
)


@pytest.mark.parametrize("with_topology", [True, False])
@pytest.mark.parametrize("activity", ["idle", "busy", "drained"])
def test_a_node_reads_back_as_the_controller_sent_it(with_topology: bool, activity: str) -> None:
    sent = to_proto_node(dataclasses.replace(VIEW, activity=activity), with_topology=with_topology)
    sent.config_apply_error = "nccl.conf: permission denied"
    read = nodes.node_from_proto(sent)
    assert (read.name, read.state, read.backend, read.activity, read.drained) == (
        "gpu-01",
        NodeState.LOST,
        Backend.GLOO,
        activity,
        True,
    )
    assert read.last_heartbeat_at == AT and read.registered_at == AT
    assert read.config_apply_error == "nccl.conf: permission denied"
    assert (read.topology == TOPOLOGY) if with_topology else read.topology is None
    assert nodes.node_to_proto(read) == sent
    assert nodes.node_data(read) == to_data(sent), "-o json prints the controller's message as it was"


def test_a_node_the_pass_builds_has_no_operator_fields_and_still_prints() -> None:
    plain = NodeInfo(NodeName("n1"), "r1", NodeState.READY, "")
    data = nodes.node_data(plain)
    assert (data["state"], data["backend"], data["activity"]) == ("ready", "unspecified", "unspecified")
    assert data["last_heartbeat_at"] is None and data["topology"] is None
    assert nodes.node_from_proto(nodes.node_to_proto(plain)) == plain


def _record(status: CommandStatus, result: agent_pb2.CommandResult | None) -> CommandRecord:
    return CommandRecord(
        id="op-1",
        node_name=NodeName("gpu-01"),
        kind="rediscover",
        status=status,
        message="done" if status.final else "",
        deliveries=2,
        body=agent_pb2.Command(rediscover=agent_pb2.Rediscover()),
        result=result,
        created_at=AT,
        finished_at=AT if status.final else None,
    )


@pytest.mark.parametrize("status", list(CommandStatus))
def test_a_command_reads_back_as_the_controller_sent_it_in_every_status(status: CommandStatus) -> None:
    result = agent_pb2.CommandResult(command_id="op-1", status=agent_pb2.COMMAND_STATUS_SUCCEEDED, topology=TOPOLOGY)
    sent = to_proto_command(_record(status, result if status.final else None))
    read = commands.command_from_proto(sent)
    assert (read.command_id, read.node_name, read.status, read.deliveries) == ("op-1", "gpu-01", status, 2)
    assert read.finished_at == (AT if status.final else None)
    assert (read.result is not None) == status.final
    assert commands.command_to_proto(read) == sent
    assert commands.command_data(read) == to_data(sent), "-o json prints the controller's message as it was"


def test_a_command_status_this_version_does_not_know_is_named() -> None:
    sent = admin_pb2.CommandInfo(command_id="op-9", status=agent_pb2.CommandStatus.ValueType(99))
    with pytest.raises(ControllerError, match=r"command op-9: the controller answered an unknown status \(99\)"):
        commands.command_from_proto(sent)


@pytest.mark.parametrize(
    ("command", "body"),
    [
        (NodeCommand.REDISCOVER, agent_pb2.Command(rediscover=agent_pb2.Rediscover())),
        (NodeCommand.DRAIN, agent_pb2.Command(drain=agent_pb2.Drain(drained=True))),
        (NodeCommand.UNDRAIN, agent_pb2.Command(drain=agent_pb2.Drain(drained=False))),
    ],
)
def test_an_operator_s_command_reaches_the_controller_as_the_body_it_runs(
    command: NodeCommand, body: agent_pb2.Command
) -> None:
    one = commands.send_command_to_proto(NodeName("gpu-01"), command, command_id="op-1")
    assert (one.node_name, one.command_id) == ("gpu-01", "op-1")
    many = commands.send_commands_to_proto([NodeName("a"), NodeName("b")], command, command_id_prefix="fan")
    assert (list(many.node_names), many.command_id_prefix) == (["a", "b"], "fan")
    for request in (one, many):
        assert from_proto_command_body(request) == body
        assert request.WhichOneof("body") == body.WhichOneof("body"), "undrain is a drain, not an empty request"


def test_a_command_info_is_a_plain_value() -> None:
    info = CommandInfo("op-1", NodeName("n1"), "drain", CommandStatus.PENDING, "", 0)
    assert commands.command_from_proto(commands.command_to_proto(info)) == info
