"""The wire contract: generated code matches the .proto files, and every RPC is implemented."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from topo_tune.controller.api.admin import AdminServicer
from topo_tune.controller.api.agent import AgentServicer
from topo_tune.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, agent_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent


def _load_generator() -> object:
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "tools" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    generator = _load_generator()
    fresh = generator.generate(tmp_path)  # type: ignore[attr-defined]
    committed_dir = ROOT / "topo_tune" / "v1"
    fresh_names = {p.name for p in fresh}
    committed = {p.name for p in committed_dir.iterdir() if "_pb2" in p.name}
    assert fresh_names == committed, "generated files differ from the committed set: run `make protos`"
    stale = [p.name for p in fresh if p.read_bytes() != (committed_dir / p.name).read_bytes()]
    assert not stale, f"stale generated code {stale}: run `make protos` and commit the result"


@pytest.mark.parametrize(
    ("module", "service", "servicer", "base"),
    [
        (agent_pb2, "AgentService", AgentServicer, agent_pb2_grpc.AgentServiceServicer),
        (admin_pb2, "AdminService", AdminServicer, admin_pb2_grpc.AdminServiceServicer),
    ],
)
def test_every_rpc_is_implemented(module: object, service: str, servicer: type, base: type) -> None:
    methods = module.DESCRIPTOR.services_by_name[service].methods_by_name  # type: ignore[attr-defined]
    missing = [name for name in methods if getattr(servicer, name) is getattr(base, name)]
    assert not missing, f"{servicer.__name__} does not implement {missing}"
    extra = [
        name for name, value in vars(servicer).items() if name[0].isupper() and callable(value) and name not in methods
    ]
    assert not extra, f"{servicer.__name__} has RPC-like methods the proto does not declare: {extra}"


def test_proto_package_is_versioned() -> None:
    assert agent_pb2.DESCRIPTOR.package == "topo_tune.v1"
    assert admin_pb2.DESCRIPTOR.package == "topo_tune.v1"
    assert "topo_tune.v1" in sys.modules
