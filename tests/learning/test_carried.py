"""A version carries, beside its chosen table, the finalists' tables the proof admits; refused ones are named
in its provenance, and a version with no challenger keeps the id it had before learning existed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.learning.test_candidates import CHALLENGER_TABLE, CHOSEN_TABLE, ENV, HEADER, MAX_LOSS, proof
from tests.tuner.landscape import NODES, Landscape, synthetic_space
from tests.tuner.output_writer import shape
from tests.tuner.test_study import study_settings, synthetic_objective
from topo_tune.errors import ValidationError
from topo_tune.learning.carried import CHALLENGER_KEY, REFUSED_KEY, carried_challengers
from topo_tune.tuner.outputs import write_outputs
from topo_tune.tuner.space import NATURAL_ORDER, RankOrder
from topo_tune.tuner.study import run_study
from topo_tune.tuning_pass.run import carry_challengers
from topo_tune.versions.version import TUNER_TABLE, ConfigVersion, challenger_table

SAFE = {"16M-4G": (1.2, 1.15, 1.25), "1M-16M": (1.05, 1.0, 1.1)}
CHOSEN = proof(1, CHOSEN_TABLE, {"16M-4G": (1.2, 1.15, 1.25)})
ADMITTED = proof(2, CHALLENGER_TABLE, SAFE)
UNSAFE = proof(3, CHALLENGER_TABLE.replace("tree,ll128", "ring,ll"), {**SAFE, "1M-16M": (0.9, 0.85, 0.95)})
OTHER_ENV = proof(4, CHALLENGER_TABLE, SAFE, env={**ENV, "NCCL_MIN_CTAS": "32"})


def test_admitted_finalists_become_challenger_files_and_refused_ones_are_named_with_their_reason() -> None:
    carried = carried_challengers(
        CHOSEN, [CHOSEN, UNSAFE, ADMITTED, OTHER_ENV], shipped_table=CHOSEN_TABLE, max_loss=MAX_LOSS
    )
    assert carried.files == {challenger_table(1): CHALLENGER_TABLE}
    assert carried.provenance[f"{CHALLENGER_KEY}1"] == "trial 2: changes allreduce 1M-16M"
    assert carried.provenance[f"{REFUSED_KEY}3"].startswith("allreduce 1M-16M: slower against NCCL's defaults")
    assert "environment or rank order differs" in carried.provenance[f"{REFUSED_KEY}4"]
    assert set(carried.provenance) == {f"{CHALLENGER_KEY}1", f"{REFUSED_KEY}3", f"{REFUSED_KEY}4"}
    version = ConfigVersion({"nccl.conf": "NCCL_MIN_CTAS=16\n", TUNER_TABLE: CHOSEN_TABLE, **carried.files})
    assert version.challengers == 1

    same_table = dataclasses.replace(ADMITTED, trial=5)
    twice = carried_challengers(CHOSEN, [ADMITTED, same_table], shipped_table=CHOSEN_TABLE, max_loss=MAX_LOSS)
    assert list(twice.files) == [challenger_table(1)] and "carried already" in twice.provenance[f"{REFUSED_KEY}5"]


def test_no_challenger_is_carried_beside_a_table_the_proof_did_not_measure_or_beside_the_defaults() -> None:
    derived = carried_challengers(CHOSEN, [ADMITTED], shipped_table=HEADER, max_loss=MAX_LOSS)
    assert derived.files == {} and "not proven as a table" in derived.provenance[f"{REFUSED_KEY}2"]
    assert carried_challengers(None, [ADMITTED], shipped_table="", max_loss=MAX_LOSS).files == {}


def test_a_version_refuses_challenger_files_without_a_chosen_table_or_with_a_gap() -> None:
    with pytest.raises(ValidationError, match=r"nccl_tuner.challenger-1.conf.*needs a chosen nccl_tuner.conf"):
        ConfigVersion({"nccl.conf": "", challenger_table(1): CHALLENGER_TABLE})
    with pytest.raises(ValidationError, match=r"nccl_tuner.challenger-1.conf.*numbered from 1 without a gap"):
        ConfigVersion({TUNER_TABLE: CHOSEN_TABLE, challenger_table(2): CHALLENGER_TABLE})
    with pytest.raises(ValidationError, match=r"not a config file name"):
        ConfigVersion({TUNER_TABLE: CHOSEN_TABLE, "nccl_tuner.challenger-5.conf": CHALLENGER_TABLE})


def test_a_pass_with_learning_on_writes_and_stores_the_challengers_and_without_any_the_id_is_unchanged(
    tmp_path: Path,
) -> None:
    outcome = run_study(
        study_settings(f"sqlite:///{tmp_path / 'study.db'}", budget=4, finalists=1, proof_pairs=2),
        space=synthetic_space(),
        objective=synthetic_objective(),
        evaluate=Landscape(),
    )
    order = RankOrder(NATURAL_ORDER, NODES)
    table = CHOSEN_TABLE.replace(",2,16", ",4,32")
    chosen = dataclasses.replace(CHOSEN, config=dataclasses.replace(CHOSEN.config, rank_order=order, tuner_table=table))
    challenger = dataclasses.replace(
        ADMITTED,
        config=dataclasses.replace(
            ADMITTED.config, rank_order=order, tuner_table=CHALLENGER_TABLE.replace(",2,16", ",4,32")
        ),
    )
    learned = dataclasses.replace(outcome, chosen=chosen, proofs=(chosen, challenger), tradeoff=None)

    def write(directory: Path, *, learning: bool) -> ConfigVersion:
        return write_outputs(
            learned,
            directory,
            shape=shape(),
            nccl_version="2.29.1",
            topology_fingerprint="t",
            plots=False,
            carry=carry_challengers if learning else None,
        ).config_version

    off = write(tmp_path / "off", learning=False)
    on = write(tmp_path / "on", learning=True)
    assert off.challengers == 0 and on.challengers == 1
    assert on.files[challenger_table(1)] == challenger.config.tuner_table
    assert (tmp_path / "on" / challenger_table(1)).read_text() == challenger.config.tuner_table
    assert on.provenance[f"{CHALLENGER_KEY}1"].startswith("trial 2: changes allreduce")
    assert {k: v for k, v in on.files.items() if k != challenger_table(1)} == dict(off.files)

    # No finalist admitted: the version is what it was without learning, to the byte and the id.
    alone = dataclasses.replace(learned, proofs=(chosen,))
    written = write_outputs(
        alone, tmp_path / "on", shape=shape(), nccl_version="2.29.1", topology_fingerprint="t", plots=False,
        carry=carry_challengers,
    ).config_version  # fmt: skip
    assert written.id == off.id and dict(written.files) == dict(off.files)
    assert not (tmp_path / "on" / challenger_table(1)).exists(), "the earlier run's challenger is removed"
