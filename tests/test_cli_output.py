"""The scripting interface: what ``-o json`` / ``-o yaml`` print for a wire message."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import yaml
from click.testing import CliRunner

from topo_tune.cli.main import cli
from topo_tune.cli.output import emit_data
from topo_tune.v1 import admin_pb2, agent_pb2, topology_pb2
from topo_tune.wire.plain_data import to_data


def node() -> admin_pb2.Node:
    topo = topology_pb2.NodeTopology(hostname="gpu-01", memory_bytes=2**41)
    topo.nics.add(name="mlx5_0", link_layer=topology_pb2.NIC_LINK_LAYER_INFINIBAND, rate_gbps=400.0)
    topo.nics.add(name="eth0", link_layer=topology_pb2.NIC_LINK_LAYER_ETHERNET)
    found = admin_pb2.Node(
        name="gpu-01",
        state=admin_pb2.NODE_STATE_READY,
        backend=agent_pb2.BACKEND_GLOO,
        activity=agent_pb2.AGENT_ACTIVITY_IDLE,
        labels={"zone": "b", "pool": "a"},
        topology=topo,
    )
    found.last_heartbeat_at.FromDatetime(datetime(2026, 5, 4, 3, 2, 1, 500000, tzinfo=UTC))
    return found


def test_plain_values_for_enums_numbers_and_timestamps() -> None:
    data = to_data(node())
    assert (data["state"], data["backend"], data["activity"]) == ("ready", "gloo", "idle")
    assert [n["link_layer"] for n in data["topology"]["nics"]] == ["infiniband", "ethernet"]
    assert data["topology"]["memory_bytes"] == 2**41  # a number, not protobuf's string
    assert data["last_heartbeat_at"] == "2026-05-04T03:02:01.500Z"
    assert datetime.fromisoformat(data["last_heartbeat_at"]) == datetime(2026, 5, 4, 3, 2, 1, 500000, tzinfo=UTC)
    assert data["registered_at"] is None, "an unset timestamp is null, not 1970"
    assert data["labels"] == {"pool": "a", "zone": "b"}
    # proto3 optional: null when unset, the value when set; every plain field is present.
    assert data["topology"]["nics"][0]["rate_gbps"] == 400.0
    assert data["topology"]["nics"][1]["rate_gbps"] is None
    assert data["drained"] is False and data["registrations"] == 0


def test_an_unset_enum_and_a_oneof() -> None:
    assert to_data(admin_pb2.Node())["state"] == "unspecified"
    topo = topology_pb2.NodeTopology()
    topo.gpu_links.add(kind=topology_pb2.LINK_KIND_NVLINK, p2p_read=topology_pb2.P2P_STATUS_NOT_SUPPORTED)
    link = to_data(topo)["gpu_links"][0]
    assert (link["kind"], link["p2p_read"]) == ("nvlink", "not_supported")
    sent = agent_pb2.ControllerMessage(heartbeat_ack=agent_pb2.HeartbeatAck(seq=2**40))
    assert to_data(sent) == {"heartbeat_ack": {"seq": 2**40}}, "of a oneof, only the member that is set"


def test_json_and_yaml_are_the_same_data(capsys: object) -> None:
    data = [to_data(node())]
    emit_data(data, "json")
    emit_data(data, "yaml")
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    json_text, yaml_text = out.split("\n]\n", 1)
    assert json.loads(json_text + "\n]") == yaml.safe_load(yaml_text) == data
    assert [n["name"] for n in json.loads(json_text + "\n]") if n["state"] == "ready"] == ["gpu-01"]


def test_topology_show_prints_plain_yaml(tmp_path: object) -> None:
    from tests.topology.test_cli_topology import FIXTURES

    path = FIXTURES / "h200-vm" / "nccl-topo-dump.xml"
    result = CliRunner().invoke(cli, ["topology", "show", "--nccl-xml", str(path), "-o", "yaml"])
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(result.stdout)
    assert data["fingerprint"].startswith("tf1-")
    words = {n["link_layer"] for n in data["topology"]["nics"]}
    assert words and words <= {"infiniband", "roce", "ethernet", "unspecified"}
