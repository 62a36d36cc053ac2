"""The nccl backend's record of NCCL's choices: staged for every job, read back per size by the worker."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from topo_tune.agent.bench.tuner_plugin import TunerPluginStage
from topo_tune.agent.bench.worker import with_choices
from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.job_spec import BenchmarkSpec, RankSlot
from topo_tune.benchmark.results import NcclChoice, SizeMeasurement
from topo_tune.benchmark.sweep import SizeSweep
from topo_tune.errors import PluginBuildError
from topo_tune.nccl.collectives import Collective
from topo_tune.plugin import PLUGIN_ENV, TABLE_ENV, BuiltPlugin, parse_tuner_table

MIB = 1 << 20
HEADER = "collective,bytes,numPipeOps,regBuff,nNodes,nRanks,nccl,applied,channels,offered\n"


def _spec(*, env: dict[str, str] | None = None, table: str = "") -> BenchmarkSpec:
    return BenchmarkSpec(
        job_id="job-1",
        collective=Collective.ALL_GATHER,
        sweep=SizeSweep(MIB, 4 * MIB, 4),
        dtype=dtype_named("float32"),
        warmup_iters=1,
        iters=2,
        placements=(False,),
        check=False,
        env=env or {},
        world_size=4,
        ranks=tuple(RankSlot(r, f"n{r // 2}", r % 2, r % 2) for r in range(4)),
        rendezvous_host="10.0.0.1",
        rendezvous_port=29500,
        tuner_table=table,
    )


def _size(n_bytes: int) -> SizeMeasurement:
    return SizeMeasurement(n_bytes, n_bytes // 16, False, 10.0, 1.0, 0.75, 0, False, 10.0, 11.0, 0.01)


def test_each_size_gets_the_recorded_call_of_the_jobs_own_communicator(tmp_path: Path) -> None:
    record = tmp_path / "tuner_record.csv"
    record.write_text(
        HEADER
        + "allreduce,4,1,0,2,4,ring/ll,ring/ll,-1,ring/ll ring/simple\n"  # the barrier: another collective
        + f"allgather,{MIB},1,0,2,2,ring/ll,ring/ll,-1,ring/ll\n"  # another communicator (2 ranks)
        + f"allgather,{MIB},1,0,2,4,ring/ll128,ring/simple,8,ring/ll ring/ll128 ring/simple\n"
    )
    sizes = with_choices(_spec(), [_size(MIB), _size(4 * MIB)], record)
    assert sizes[0].choice == NcclChoice(("ring/ll", "ring/ll128", "ring/simple"), "ring/ll128", "ring/simple", 8)
    assert sizes[1].choice is None, "a size the record lacks reports no choice"


def test_a_graph_timed_job_reports_the_captured_calls_choice(tmp_path: Path) -> None:
    record = tmp_path / "tuner_record.csv"
    record.write_text(
        HEADER
        + f"allgather,{MIB},1,0,2,4,ring/ll,ring/ll,-1,ring/ll ring/simple\n"  # the eager warm-up
        + f"allgather,{MIB},1,1,2,4,ring/simple,ring/simple,-1,ring/simple\n"  # captured: registered buffers
    )
    spec = _spec()
    eager = with_choices(spec, [_size(MIB)], record)[0].choice
    graphed = with_choices(dataclasses.replace(spec, cuda_graph=True), [_size(MIB)], record)[0].choice
    assert eager is not None and graphed is not None
    assert (eager.nccl, graphed.nccl, graphed.offered) == ("ring/ll", "ring/simple", ("ring/simple",))


def test_a_missing_record_leaves_the_measurements_as_they_are(tmp_path: Path) -> None:
    sizes = [_size(MIB)]
    assert with_choices(_spec(), sizes, tmp_path / "absent.csv") == sizes
    (tmp_path / "bad.csv").write_text("allgather,1\n")
    assert with_choices(_spec(), sizes, tmp_path / "bad.csv") == sizes


def _stage(tmp_path: Path, builder: object | None = None) -> TunerPluginStage:
    def fake_build(directory: Path) -> BuiltPlugin:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "libnccl-tuner-topotune.so").write_bytes(b"")
        return BuiltPlugin(directory / "libnccl-tuner-topotune.so", ("cc",), "")

    return TunerPluginStage(
        installed_dirs=(),
        build_dir=tmp_path / "plugin",
        table_dir=tmp_path / "tables",
        builder=builder or fake_build,  # type: ignore[arg-type]
    )


def test_a_job_without_a_table_loads_the_plugin_with_an_empty_one(tmp_path: Path) -> None:
    staged = _stage(tmp_path).recording(_spec(env={"NCCL_DEBUG": "WARN"}))
    assert staged.env["NCCL_DEBUG"] == "WARN"
    assert staged.env[PLUGIN_ENV] == str(tmp_path / "plugin" / "libnccl-tuner-topotune.so")
    assert parse_tuner_table(Path(staged.env[TABLE_ENV]).read_text()) == (), "no row: NCCL decides everything"


def test_a_job_with_its_own_plugin_or_a_table_is_left_to_it(tmp_path: Path) -> None:
    stage = _stage(tmp_path)
    own = _spec(env={PLUGIN_ENV: "/opt/other/libnccl-tuner-x.so"})
    assert stage.recording(own) == own
    tabled = _spec(table="allgather,0,1024,ring,ll,-1,-1,-1\n")
    assert stage.recording(tabled) == tabled


def test_without_a_library_the_job_runs_unrecorded(tmp_path: Path) -> None:
    def no_compiler(directory: Path) -> BuiltPlugin:
        raise PluginBuildError("no C compiler found")

    spec = _spec()
    assert _stage(tmp_path, no_compiler).recording(spec) == spec
    with pytest.raises(ValueError, match="no C compiler"):
        _stage(tmp_path, no_compiler).staged(_spec(table="allgather,0,1024,ring,ll,-1,-1,-1\n"))
