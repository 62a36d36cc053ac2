"""The plugin's profiler path, driven by a small C program that plays NCCL's events (``profiler_driver.c``).

It checks what a job's record would hold: every call counted per (collective, size class, algorithm/protocol),
one call in K timed from its kernel channels' GPU stamps, NCCL's kernel-event bit on only before a sampled
call, late events of a finished sample ignored, and the file written at finalize.
"""

from __future__ import annotations

import ctypes
import math
import os
import subprocess
from pathlib import Path

import pytest

from topo_tune.plugin import find_compiler
from topo_tune.plugin.timing_record import TimingRecord, parse_timing_record

HERE = Path(__file__).resolve().parent
PLUGIN_SOURCES = HERE.parents[1] / "topo_tune" / "plugin"
CALLS = 12
# The driver's schedule: even calls all_reduce 1 KiB ring/LL on 2 channels of 5000 ns, odd ones all_gather
# 1 MiB ring/SIMPLE on 4 channels of 80000 ns; channel c starts 10*c ns late, so a call takes
# 10 * (channels - 1) + its channel time from first start to last stop.
ALLREDUCE_NS = 10 * 1 + 5000
ALLGATHER_NS = 10 * 3 + 80000


@pytest.fixture(scope="session")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("driver") / "profiler_driver"
    flags = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-I", str(PLUGIN_SOURCES)]
    subprocess.run(
        [*find_compiler(os.environ), *flags, "-o", str(out), str(HERE / "profiler_driver.c"), "-ldl"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def run(
    driver: Path, library: Path, *, version: int, env: dict[str, str], comms: int = 1
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOPO_TUNE_")}
    return subprocess.run(
        [str(driver), str(library), str(version), str(CALLS), str(comms)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def record(directory: Path) -> TimingRecord:
    (path,) = directory.glob("topo-tune-timing.*.txt")
    return parse_timing_record(path.read_text(), source=path.name)


@pytest.mark.parametrize("version", [4, 5])
def test_one_call_in_k_is_timed_from_its_kernel_channels_and_every_call_is_counted(
    driver: Path, plugin_library_path: Path, tmp_path: Path, version: int
) -> None:
    done = run(
        driver,
        plugin_library_path,
        version=version,
        env={"TOPO_TUNE_WORKLOAD_DIR": str(tmp_path), "TOPO_TUNE_TIMING_SAMPLE": "3", "TOPO_TUNE_LEARNING_ARM": "2"},
    )
    out = done.stdout.splitlines()
    assert out[0] == "context 1 coll 1", "timing asked for: a context, and NCCL's collective events switched on"
    for n in range(CALLS):
        sampled = int(n % 3 == 0)
        assert out[1 + n] == f"call {n} kernel {sampled} sampled {sampled}", (
            "kernel events are enabled exactly for the sampled calls, before each is made"
        )
    assert out[-2:] == ["late refused 1", "mask kernel after finalize 0"]
    written = record(tmp_path)
    assert (written.comm, written.rank, written.n_ranks, written.n_nodes) == (0xABC, 1, 2, 1)
    assert (written.sample, written.arm, written.unfinished, written.overflow) == (3, 2, 0, 0)
    by_collective = {cell.collective: cell for cell in written.cells}
    assert set(by_collective) == {"allreduce", "allgather"}
    # Sampled calls 0, 6 are all_reduces, 3, 9 all_gathers.
    for name, class_bytes, choice, ns in (
        ("allreduce", 1024, "ring/ll", ALLREDUCE_NS),
        ("allgather", 1 << 20, "ring/simple", ALLGATHER_NS),
    ):
        line = by_collective[name]
        assert (line.class_bytes, line.choice, line.calls, line.timed) == (class_bytes, choice, CALLS // 2, 2)
        assert (line.sum_ns, line.min_ns, line.max_ns) == (2 * ns, ns, ns)
        assert line.sum_log == pytest.approx(2 * math.log(ns), rel=1e-8)
        assert line.sum_sq_log == pytest.approx(2 * math.log(ns) ** 2, rel=1e-8)


def test_the_profiler_exports_only_its_structs(plugin_library_path: Path) -> None:
    library = ctypes.CDLL(str(plugin_library_path))
    for version in (4, 5, 6):
        assert ctypes.c_char_p.in_dll(library, f"ncclProfiler_v{version}").value == b"TopoTune"
    for internal in ("tpInit", "tpStartEvent", "tpContexts", "tpMask"):
        assert not hasattr(library, internal), internal


def test_communicators_sharing_nccls_one_mask_each_time_their_own_calls(
    driver: Path, plugin_library_path: Path, tmp_path: Path
) -> None:
    env = {"TOPO_TUNE_WORKLOAD_DIR": str(tmp_path), "TOPO_TUNE_TIMING_SAMPLE": "3"}
    out = run(driver, plugin_library_path, version=5, env=env, comms=3).stdout.splitlines()
    calls = [line.split() for line in out if line.startswith("comm ")]
    assert len(calls) == 3 * CALLS
    for _, comm, _, n, _, kernel, _, sampled in calls:
        assert sampled == str(int(int(n) % 3 == 0)), f"comm {comm} samples its own call count"
        assert kernel == "1" or sampled == "0", "a sampled call is always made with kernel events on"
    assert out[-1] == "mask kernel after finalize 0", "the last communicator's finalize turns kernel events off"
    records = sorted(
        (parse_timing_record(p.read_text()) for p in tmp_path.glob("topo-tune-timing.*.txt")), key=lambda r: r.comm
    )
    assert [r.comm for r in records] == [0xABC, 0xABD, 0xABE], "one file per communicator, named by its id"
    for r in records:
        assert {(c.collective, c.calls, c.timed) for c in r.cells} == {("allreduce", 6, 2), ("allgather", 6, 2)}


def test_k_of_one_times_every_call(driver: Path, plugin_library_path: Path, tmp_path: Path) -> None:
    done = run(
        driver,
        plugin_library_path,
        version=5,
        env={"TOPO_TUNE_WORKLOAD_DIR": str(tmp_path), "TOPO_TUNE_TIMING_SAMPLE": "1"},
    )
    assert all(line.endswith("kernel 1 sampled 1") for line in done.stdout.splitlines()[1 : 1 + CALLS])
    written = record(tmp_path)
    assert written.sample == 1 and written.arm is None, "no arm variable: the record says so"
    assert {(c.collective, c.calls, c.timed) for c in written.cells} == {("allreduce", 6, 6), ("allgather", 6, 6)}


@pytest.mark.parametrize(
    ("env", "warning"),
    [
        ({}, None),
        ({"TOPO_TUNE_TIMING_SAMPLE": "3"}, None),  # no directory: the workload directory is where records go
        ({"TOPO_TUNE_WORKLOAD_DIR": "{tmp}"}, None),  # no period: timing is off unless asked for
        ({"TOPO_TUNE_WORKLOAD_DIR": "{tmp}", "TOPO_TUNE_TIMING_SAMPLE": "0"}, "TOPO_TUNE_TIMING_SAMPLE=0 is not"),
        ({"TOPO_TUNE_WORKLOAD_DIR": "{tmp}", "TOPO_TUNE_TIMING_SAMPLE": "3x"}, "TOPO_TUNE_TIMING_SAMPLE=3x is not"),
        ({"TOPO_TUNE_WORKLOAD_DIR": "{tmp}/missing", "TOPO_TUNE_TIMING_SAMPLE": "3"}, "cannot open"),
    ],
)
def test_without_both_settings_nothing_is_timed_or_written_and_a_bad_one_is_one_warning(
    driver: Path, plugin_library_path: Path, tmp_path: Path, env: dict[str, str], warning: str | None
) -> None:
    done = run(driver, plugin_library_path, version=5, env={k: v.format(tmp=tmp_path) for k, v in env.items()})
    out = done.stdout.splitlines()
    assert out[0] == "context 0 coll 0"
    assert all(line.endswith("kernel 0 sampled 0") for line in out[1 : 1 + CALLS]), "no kernel events, no samples"
    assert list(tmp_path.iterdir()) == []
    warnings = [line for line in done.stderr.splitlines() if line.startswith("log 2:")]
    if warning is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and warning in warnings[0]
