"""One name for one thing: collectives, backends, trial roles and the proof's defaults each have one definition, and
every mapping from it is total (no branch that quietly picks a collective)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest

from topo_tune.cli.agent import run as agent_run
from topo_tune.config import cluster as cluster_config
from topo_tune.config.cluster import SearchConfig
from topo_tune.errors import SpecError
from topo_tune.nccl.backends import LAUNCHED_BACKENDS, Backend
from topo_tune.nccl.collectives import PLUGIN_COLLECTIVES, Collective
from topo_tune.plugin import table
from topo_tune.sim.demo import ndr_pair
from topo_tune.sim.knobs import parse_env
from topo_tune.sim.model import offered, run
from topo_tune.sim.plan import build_plan
from topo_tune.tuner import objective, plugin_table, statistics
from topo_tune.tuner.trial_store import TrialRole, role_of
from topo_tune.v1 import agent_pb2
from topo_tune.wire.benchmark import COLLECTIVE_TO_PROTO, collective_from_proto
from topo_tune.wire.values import BACKEND_FROM_WIRE, BACKEND_TO_WIRE, backend_to_wire

PLUGIN_SOURCE = Path(table.__file__).with_name("topotune_tuner.c")
CHART_SCHEMA = Path(__file__).resolve().parent.parent / "charts" / "topo-tune" / "values.schema.json"


def test_every_collective_has_one_name_in_each_vocabulary() -> None:
    for c in Collective:
        assert (c.plugin_name is None) == c.point_to_point, c
        assert c.nccl_name and c.nccl_name.lower().replace("_", "") == c.value.replace("_", "")
        if c.plugin_name is not None:
            assert Collective.from_plugin_name(c.plugin_name) is c
    assert tuple(c.value for c in Collective) == objective.COLLECTIVES
    assert dict(plugin_table.PLUGIN_COLLECTIVES) == {c.value: c.plugin_name for c in Collective if not c.point_to_point}
    with pytest.raises(ValueError, match="known: broadcast, reduce, allgather"):
        Collective.from_plugin_name("all_reduce")


def test_the_plugin_s_python_and_c_tables_name_the_same_collectives_in_nccl_s_order() -> None:
    assert table.COLLECTIVES == PLUGIN_COLLECTIVES
    c_names = re.findall(r'\{"([a-z]+)", ncclFunc[A-Za-z]+\}', PLUGIN_SOURCE.read_text())
    assert tuple(c_names) == PLUGIN_COLLECTIVES


def test_the_wire_maps_every_collective_and_names_the_field_of_an_unknown_one() -> None:
    for c in Collective:
        assert collective_from_proto(COLLECTIVE_TO_PROTO[c]) is c
    with pytest.raises(SpecError, match=r"job\.collective: 0 is not a collective"):
        collective_from_proto(agent_pb2.COLLECTIVE_UNSPECIFIED, field="job.collective")
    with pytest.raises(SpecError, match="99"):
        collective_from_proto(99)


def test_the_simulator_prices_every_collective_by_its_own_rule() -> None:
    cluster = ndr_pair()
    plan = build_plan(cluster, tuple(n.name for n in cluster.nodes), parse_env({}))
    times = {c: run(plan, c, 64 << 20).time_us for c in Collective}
    assert all(t > 0 for t in times.values())
    # all_reduce moves twice what all_gather does; broadcast's chain moves the whole buffer every hop.
    assert times[Collective.ALL_REDUCE] > times[Collective.ALL_GATHER]
    assert times[Collective.BROADCAST] != times[Collective.ALL_GATHER]
    assert not offered(plan, Collective.ALLTOALL) and offered(plan, Collective.ALL_REDUCE)


def test_trial_roles_are_one_enum_and_what_is_stored_reads_back() -> None:
    assert role_of({}) is TrialRole.SAMPLED
    for role in TrialRole:
        assert role_of({"role": role.value}) is role
    assert {r for r in TrialRole if r.has_table} == {TrialRole.TABLE, TrialRole.OPTION, TrialRole.PER_SIZE}
    with pytest.raises(ValueError, match="'composed'"):
        role_of({"role": "composed"})


def test_the_proof_s_defaults_are_defined_once() -> None:
    search = SearchConfig()
    assert (search.min_effect, search.max_loss) == (statistics.DEFAULT_MIN_EFFECT, statistics.DEFAULT_MAX_LOSS)
    assert statistics.DEFAULT_ALPHA == cluster_config.PROOF_ALPHA
    schema = cluster_config.ClusterConfig.model_json_schema(by_alias=True)
    fields = schema["$defs"]["SearchConfig"]["properties"]
    assert (fields["minEffect"]["default"], fields["maxLoss"]["default"]) == (search.min_effect, search.max_loss)


def test_backends_are_one_enum_and_every_place_that_names_them_takes_exactly_its_members() -> None:
    names = [b.value for b in Backend]
    for b in Backend:
        assert BACKEND_FROM_WIRE[BACKEND_TO_WIRE[b]] is b
        assert backend_to_wire(b.value) == BACKEND_TO_WIRE[b]
    assert set(BACKEND_FROM_WIRE) == set(agent_pb2.Backend.values()) - {agent_pb2.BACKEND_UNSPECIFIED}
    assert backend_to_wire("mpi") == agent_pb2.BACKEND_UNSPECIFIED
    assert cluster_config.json_schema()["properties"]["backend"]["enum"] == names
    for name in names:
        cluster = cluster_config.loads_cluster_config(f"apiVersion: topo-tune/v1\nbackend: {name}\n")
        assert cluster.backend is Backend(name)
    option = next(p for p in agent_run.params if p.name == "backend")
    assert isinstance(option.type, click.Choice) and list(option.type.choices) == names
    chart = json.loads(CHART_SCHEMA.read_text(encoding="utf-8"))
    assert chart["properties"]["agent"]["properties"]["backend"]["enum"] == names
    assert tuple(b for b in Backend if not b.simulated) == LAUNCHED_BACKENDS


def test_no_class_name_is_defined_twice_in_the_package() -> None:
    """A reader who meets a class name in an import finds one definition: two concepts never share a name in the
    package, its benchmarks and tools (generated code and module-private classes aside)."""
    root = Path(__file__).resolve().parent.parent
    where: dict[str, list[str]] = {}
    for path in sorted(p for tree in ("topo_tune", "benchmarks", "tools") for p in (root / tree).rglob("*.py")):
        if path.parent.name == "v1":
            continue
        for name in re.findall(r"^class ([A-Za-z][A-Za-z0-9_]*)", path.read_text(encoding="utf-8"), re.MULTILINE):
            where.setdefault(name, []).append(str(path.relative_to(root)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
