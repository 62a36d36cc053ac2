"""The fault suite's figures: each scenario records the faults it injected, the resumes it saw and the rows
it checked, appended as one JSON line to the file ``TOPO_TUNE_FAULT_FIGURES`` names (nothing when unset).

``benchmarks/fault_suite.py`` runs the suite with it set and prints the table in ``benchmarks/results/faults.md``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def record(scenario: str, *, faults: int, resumes: int, rows: int, measured: str = "") -> None:
    """``measured``: what the scenario measured besides the counts (the memory test's RSS), in a few words."""
    target = os.environ.get("TOPO_TUNE_FAULT_FIGURES")
    if not target:
        return
    line = {"scenario": scenario, "faults": faults, "resumes": resumes, "rows": rows, "measured": measured}
    with Path(target).open("a") as out:
        out.write(json.dumps(line) + "\n")
    print(f"fault figures: {line}", file=sys.stderr)
