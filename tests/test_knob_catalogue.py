"""One catalogue of NCCL variables: the policy, the search space, the site keys, the simulator and the docs
all derive from it, agree with it, and a knob added to it alone shows up in each."""

from __future__ import annotations

from pathlib import Path

import pytest

from topo_tune.benchmark.env_policy import VARIABLES, EnvPolicy
from topo_tune.errors import EnvPolicyError, SimInputError
from topo_tune.nccl import variables as catalogue
from topo_tune.nccl.docs_table import render
from topo_tune.nccl.value_types import Int
from topo_tune.nccl.variables import CATALOGUE, CatalogueDimension, Variable, VariableRole
from topo_tune.sim.knobs import MODELLED_VARIABLES, parse_env
from topo_tune.tuner.space import FORBIDDEN, SITE_FIXED_KEYS, Fabric, RankOrder, SearchSpace

ROOT = Path(__file__).resolve().parent.parent


def _widest_space() -> SearchSpace:
    """A space where every dimension applies: a new NCCL, several nodes with IB, sockets, NVLS, alltoall."""
    nodes = ("n0", "n1")
    return SearchSpace.build(
        nccl_version="2.28.3",
        fabric=Fabric(nodes=2, ib=True, socket=True, nvls=True),
        collectives=["all_reduce", "alltoall"],
        rank_orders=[RankOrder("natural", nodes)],
    )


def test_the_policy_accepts_exactly_the_catalogue_with_its_types() -> None:
    assert dict(VARIABLES) == {v.name: v.type for v in CATALOGUE}


def test_the_space_searches_exactly_the_searched_variables() -> None:
    set_by_space = {k for d in _widest_space().dimensions for s in d.settings.values() for k in s}
    assert set_by_space == CATALOGUE.names(VariableRole.SEARCHED)
    assert [d.name for d in _widest_space().dimensions] == [d.name for d in CATALOGUE.dimensions]


def test_the_refused_and_site_knobs_are_the_catalogue_s() -> None:
    assert dict(FORBIDDEN) == {v.name: v.hazard for v in CATALOGUE if v.hazard}
    assert set(CATALOGUE.names(VariableRole.FORBIDDEN)) <= set(FORBIDDEN)
    assert CATALOGUE.names(VariableRole.SITE) == SITE_FIXED_KEYS
    assert not SITE_FIXED_KEYS & CATALOGUE.names(VariableRole.SEARCHED)


@pytest.mark.parametrize("name", sorted(v.name for v in CATALOGUE))
def test_the_simulator_reads_exactly_the_variables_marked_sim(name: str) -> None:
    # A value no NCCL variable takes: the model refuses it if (and only if) it reads the variable.
    variable = CATALOGUE.get(name)
    assert variable is not None
    if variable.sim:
        assert name in MODELLED_VARIABLES
        with pytest.raises(SimInputError, match=name):
            parse_env({name: "not-a-value"})
    else:
        assert name not in MODELLED_VARIABLES
        parse_env({name: "not-a-value"})


def test_the_docs_table_is_generated_from_the_catalogue() -> None:
    committed = (ROOT / "docs" / "nccl-variables.md").read_text(encoding="utf-8")
    assert committed == render(CATALOGUE), "docs/nccl-variables.md is stale: run `python tools/gen_docs.py`"


def test_a_knob_added_to_the_catalogue_alone_reaches_the_space_the_policy_and_the_docs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = Variable("NCCL_FAKE_DEPTH", Int(1, 8), VariableRole.SEARCHED, "a knob that does not exist")
    dimension = CatalogueDimension("fake_depth", ("NCCL_FAKE_DEPTH",), (None, (2,), (4,)), ordered=True, reason="fake")
    monkeypatch.setattr(catalogue, "CATALOGUE", CATALOGUE.extended([fake], [dimension]))

    space = SearchSpace.build(
        nccl_version="2.28.3",
        fabric=Fabric(nodes=1),
        collectives=["all_reduce"],
        rank_orders=[RankOrder("natural", ("n0",))],
        knobs=["NCCL_FAKE_DEPTH"],
    )
    assert space.names == ("fake_depth",)
    assert dict(space.config({"fake_depth": "4"}).env) == {"NCCL_FAKE_DEPTH": "4"}

    EnvPolicy().check({"NCCL_FAKE_DEPTH": "2"})
    with pytest.raises(EnvPolicyError, match=r"NCCL_FAKE_DEPTH.*outside 1\.\.8"):
        EnvPolicy().check({"NCCL_FAKE_DEPTH": "9"})

    assert "| `NCCL_FAKE_DEPTH` | searched | integer 1..8 | fake_depth |" in render(catalogue.CATALOGUE)


def test_a_catalogue_that_contradicts_itself_is_refused() -> None:
    loose = Variable("NCCL_LOOSE", Int(0, 1), VariableRole.SEARCHED, "searched by no dimension")
    with pytest.raises(ValueError, match="no dimension sets it"):
        CATALOGUE.extended([loose])
    with pytest.raises(ValueError, match="forbidden without saying why"):
        CATALOGUE.extended([Variable("NCCL_BAD", Int(0, 1), VariableRole.FORBIDDEN, "no hazard given")])
    with pytest.raises(ValueError, match="not a searched variable"):
        CATALOGUE.extended([], [CatalogueDimension("d", ("NCCL_IB_HCA",), (None, (1,)), ordered=False, reason="")])
    with pytest.raises(ValueError, match="listed twice"):
        CATALOGUE.extended([CATALOGUE.variables[0]])
