"""A version's evidence: divergent jobs set aside and counted, challengers compared per (collective, size
class) where their table applies, and proposable only when better there and never worse."""

from __future__ import annotations

import dataclasses
import math

from tests.learning.test_candidates import CHALLENGER_TABLE, CHOSEN_TABLE
from topo_tune.learning.version_evidence import version_evidence
from topo_tune.plugin.timing_record import TimingCell, TimingRecord

MIB2 = 2 << 20  # the class (1 MiB, 2 MiB]: the challenger's tree/LL128 row applies there
KIB = 1024  # the class (512 B, 1 KiB]: both tables run ring/LL


def cell(collective: str, class_bytes: int, ns: float, *, calls: int = 8, choice: str = "ring/ll") -> TimingCell:
    timed = 4
    log = math.log(ns)
    return TimingCell(collective, class_bytes, choice, calls, timed, int(ns * timed), int(ns), int(ns), log * timed,
                      log * log * timed)  # fmt: skip


def job(arm: int, large_ns: float, small_ns: float, *, rank1_calls: int = 8) -> list[TimingRecord]:
    records = []
    for rank, calls in ((0, 8), (1, rank1_calls)):
        cells = (cell("allreduce", MIB2, large_ns, calls=calls), cell("allreduce", KIB, small_ns))
        records.append(TimingRecord(f"h{rank}:1", 0xABC, rank, 2, 1, 4, arm, 0, 0, cells))
    return records


def test_a_challenger_faster_where_it_applies_and_safe_there_is_proposable() -> None:
    jobs = {f"chosen-{i}": job(0, 100_000 * (1 + 0.01 * (i % 3)), 5000 * (1 + 0.01 * (i % 2))) for i in range(6)}
    jobs |= {f"explore-{i}": job(1, 80_000 * (1 + 0.01 * (i % 3)), 5000 * (1 + 0.01 * (i % 2))) for i in range(6)}
    jobs["diverged"] = job(1, 80_000, 5000, rank1_calls=7)
    evidence = version_evidence("cv-0000000000000001", jobs, tables=[CHOSEN_TABLE, CHALLENGER_TABLE])
    assert evidence.jobs_by_arm == {0: 6, 1: 6}, "the divergent job is not pooled"
    assert len(evidence.divergent) == 1 and evidence.divergent[0].startswith("diverged: comm abc: rank 1 ran")
    by_class = {c.class_bytes: c for c in evidence.cells}
    large, small = by_class[MIB2], by_class[KIB]
    assert large.applies and large.decision == "faster" and 1.2 < large.speedup < 1.3 and large.jobs == 6
    assert not small.applies, "both tables run the same rows below 1 KiB"
    assert evidence.proposable == [1]


def test_a_challenger_slower_where_it_applies_is_not_proposable() -> None:
    jobs = {f"chosen-{i}": job(0, 100_000 * (1 + 0.01 * (i % 3)), 5000) for i in range(6)}
    jobs |= {f"explore-{i}": job(1, 130_000 * (1 + 0.01 * (i % 3)), 5000) for i in range(6)}
    evidence = version_evidence("cv-0000000000000001", jobs, tables=[CHOSEN_TABLE, CHALLENGER_TABLE])
    assert {c.class_bytes: c.decision for c in evidence.cells}[MIB2] == "slower"
    assert evidence.proposable == []
    too_few = {k: v for k, v in jobs.items() if k in ("chosen-0", "explore-0")}
    assert version_evidence("cv-0000000000000001", too_few, tables=[CHOSEN_TABLE, CHALLENGER_TABLE]).cells == []


def test_a_class_only_the_chosen_tables_jobs_called_is_left_out_not_a_crash() -> None:
    jobs = {f"chosen-{i}": job(0, 100_000 * (1 + 0.01 * i), 5000) for i in range(3)}
    jobs |= {f"explore-{i}": job(1, 80_000 * (1 + 0.01 * i), 5000) for i in range(3)}
    for name in ("chosen-0", "chosen-1"):
        jobs[name] = [dataclasses.replace(r, cells=(*r.cells, cell("allgather", MIB2, 50_000))) for r in jobs[name]]
    evidence = version_evidence("cv-0000000000000001", jobs, tables=[CHOSEN_TABLE, CHALLENGER_TABLE])
    assert {(c.collective, c.class_bytes) for c in evidence.cells} == {("allreduce", MIB2), ("allreduce", KIB)}
