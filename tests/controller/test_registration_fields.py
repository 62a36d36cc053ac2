"""Every text field an agent registers or reports about its node is bounded and of its class, over real gRPC:
a label, a version, a host name, a GPU or NIC name, a PCI bus id, an NCCL topology attribute. A value outside
its class is refused with INVALID_ARGUMENT naming the field, and nothing is stored."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc
import grpc.aio
import pytest
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from tests.controller.test_services import expect_refused_registration, expect_status, open_session, register
from tests.topology.conftest import FIXTURES
from topo_tune.controller.api.topology_fields import FIELDS
from topo_tune.controller.server import Controller
from topo_tune.v1 import agent_pb2, topology_pb2


@pytest.fixture
async def channel(controller: Controller) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as opened:
        yield opened


def recorded() -> topology_pb2.NodeTopology:
    """What discovery reported on a real H200 machine: every check below starts from real values."""
    text = (FIXTURES / "h200-vm" / "discovered-on-device.json").read_text()
    return json_format.Parse(text, topology_pb2.NodeTopology(), ignore_unknown_fields=True)


def with_topology(change: Callable[[topology_pb2.NodeTopology], object]) -> agent_pb2.AgentMessage:
    topo = recorded()
    change(topo)
    return register("n1", topology=topo)


def _xml_attribute(topo: topology_pb2.NodeTopology, value: str) -> None:
    topo.nccl_topology.tag = "system"
    topo.nccl_topology.children.add(tag="cpu").attributes.add(name="affinity", value=value)


REFUSED = [
    # Labels: keys are tokens (Kubernetes' prefix/name fits), values printable text.
    (register("n1", labels={"zone name": "a"}), "register.labels['zone name']: key: allowed characters"),
    (register("n1", labels={"zone\x1b[2J": "a"}), "register.labels['zone\\x1b[2J']: key: allowed characters"),
    (register("n1", labels={"zone": "a\x1b]0;title\x07"}), "register.labels['zone']: holds a control"),
    (register("n1", labels={"zone": "a\u202eb"}), "register.labels['zone']: holds a control or bidirectional"),
    (register("n1", labels={"zone": "a\u200bb"}), "register.labels['zone']: holds a control or bidirectional"),
    # Versions a person reads: printable text only, whatever the escape.
    (register("n1", agent_version="1.0\x00"), "register.agent_version: holds a control"),
    (register("n1", agent_version="1.0\u2028x"), "register.agent_version: holds a character that is not printable"),
    (register("n1", applied_config_version="cv-1 --x"), "register.applied_config_version: allowed characters"),
    # The topology: host names, tokens and text by field, each bounded.
    (with_topology(lambda t: setattr(t, "hostname", "vm\nforged")), "register.topology.hostname: expected a host"),
    (with_topology(lambda t: setattr(t, "hostname", "h" * 300)), "register.topology.hostname: longer than 253"),
    (
        with_topology(lambda t: setattr(t.gpus[0], "name", "NVIDIA H200\x1b[2J")),
        "register.topology.gpus[0].name: holds a control",
    ),
    (
        with_topology(lambda t: setattr(t.gpus[0], "name", "G" * 129)),
        "register.topology.gpus[0].name: longer than 128 characters",
    ),
    (
        with_topology(lambda t: setattr(t.gpus[0], "pci_bus_id", "0000:00:06.0 [/x]")),
        "register.topology.gpus[0].pci_bus_id: allowed characters",
    ),
    (
        with_topology(lambda t: setattr(t.nics[0], "name", "eth0\u202e")),
        "register.topology.nics[0].name: allowed characters",
    ),
    (
        with_topology(lambda t: t.nics[0].netdevs.extend(["eth0", "eth1;reboot"])),
        "register.topology.nics[0].netdevs[1]: allowed characters",
    ),
    (
        with_topology(lambda t: t.unknowns.append("x" * 1025)),
        "register.topology.unknowns[4]: longer than 1024 characters",
    ),
    (
        with_topology(lambda t: setattr(t.versions, "nccl", "2.21\x1b]8;;http://x\x07")),
        "register.topology.versions.nccl: holds a control",
    ),
    (
        with_topology(lambda t: t.excluded_nics.add(name="mlx5_0:2", reason="down\u202e")),
        "register.topology.excluded_nics[0].reason: holds a control or bidirectional",
    ),
    (
        with_topology(lambda t: _xml_attribute(t, "ff\x00ff")),
        "register.topology.nccl_topology.children[0].attributes[0].value: holds a control",
    ),
]


@pytest.mark.parametrize(("message", "details"), REFUSED, ids=[d for _, d in REFUSED])
async def test_a_field_outside_its_class_is_refused_by_name(
    channel: grpc.aio.Channel, controller: Controller, message: agent_pb2.AgentMessage, details: str
) -> None:
    await expect_refused_registration(channel, controller, message, details)


async def test_real_values_and_printable_markup_register(channel: grpc.aio.Channel, controller: Controller) -> None:
    """A recorded machine's topology passes as it is; text that is merely odd (rich markup, quotes, non-ASCII
    letters) is stored, for the CLI to show as inert text."""
    message = with_topology(lambda t: _xml_attribute(t, "ffff,ffff"))
    message.register.labels.update({"topology.kubernetes.io/zone": "[/x] [link=http://x]y[/link] Zürich"})
    message.register.agent_version = "0.9 'beta' [bold]"
    call = await open_session(channel, message)
    assert (await asyncio.wait_for(call.read(), 10)).registered.node_name == "n1"
    stored = await controller.registry.list()
    assert [n.name for n in stored] == ["n1"]
    call.cancel()


async def test_a_rediscovered_topology_is_checked_as_a_registered_one(channel: grpc.aio.Channel) -> None:
    call = await open_session(channel, register("n1"))
    await asyncio.wait_for(call.read(), 10)
    topo = recorded()
    topo.nics[0].device = "mlx5_0\x1b[2J"
    forged = agent_pb2.CommandResult(command_id="c1", status=agent_pb2.COMMAND_STATUS_SUCCEEDED, topology=topo)
    await call.write(agent_pb2.AgentMessage(result=forged))
    await expect_status(call, grpc.StatusCode.INVALID_ARGUMENT, "result.topology.nics[0].device: allowed characters")


def _string_fields(message: Descriptor, seen: set[str]) -> set[tuple[str, str]]:
    if message.full_name in seen:
        return set()
    seen.add(message.full_name)
    found: set[tuple[str, str]] = set()
    for field in message.fields:
        if field.type == FieldDescriptor.TYPE_STRING:
            found.add((message.name, field.name))
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            found |= _string_fields(field.message_type, seen)
    return found


def test_every_text_field_of_a_topology_has_a_class() -> None:
    """A string field added to the proto is refused until the table says what it may hold."""
    assert _string_fields(topology_pb2.NodeTopology.DESCRIPTOR, set()) == set(FIELDS)
