"""The fault suite's figures: faults injected, resumes seen and rows checked, per scenario, and the wall time.

Runs ``pytest -m "faults or faults_long"`` (every test of the fault suite, the long ones too: under
``tests/faults/`` and the existing kill and restart tests it reuses) with ``TOPO_TUNE_FAULT_FIGURES`` set, so
each scenario appends what it did (``tests/faults/figures.py``), then prints one table. Needs root (tmpfs
mounts) and PostgreSQL's server binaries, as the suite does.

Usage: ``python benchmarks/fault_suite.py [-- PYTEST-ARGS...]``; the table goes to
``benchmarks/results/faults.md`` with the command and the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    extra = sys.argv[2:] if sys.argv[1:2] == ["--"] else sys.argv[1:]
    with tempfile.TemporaryDirectory() as workdir:
        figures = Path(workdir) / "figures.jsonl"
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-m", "faults or faults_long", "-q", "-p", "no:cacheprovider", *extra],
            env={**os.environ, "TOPO_TUNE_FAULT_FIGURES": str(figures)},
            capture_output=True,
            text=True,
            check=False,
        )
        took = time.monotonic() - started
        rows = [json.loads(line) for line in figures.read_text().splitlines()] if figures.exists() else []
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "(no pytest output)"
    print(f"pytest -m 'faults or faults_long': {summary}; {took:.0f} s wall")
    print("| scenario | faults injected | resumes | rows checked | measured |")
    print("|---|---:|---:|---:|---|")
    for row in rows:
        print(f"| {row['scenario']} | {row['faults']} | {row['resumes']} | {row['rows']} | {row.get('measured', '')} |")
    total = {key: sum(int(r[key]) for r in rows) for key in ("faults", "resumes", "rows")}
    print(f"| **all {len(rows)} scenarios** | {total['faults']} | {total['resumes']} | {total['rows']} | |")
    if done.returncode != 0:
        print(done.stdout[-4000:], file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
