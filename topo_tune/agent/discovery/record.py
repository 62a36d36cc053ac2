"""Record a discovery fixture on a real machine: ``python -m topo_tune.agent.discovery.record OUT_DIR``.

Purpose: run the real discovery once with NVML wrapped in a recorder and write what it saw (``nvml.json``, every
NVML answer including the errors; ``sysfs.json``, the files it read; ``topology.json``, the result) so tests can
replay that machine. Non-goals: anything that changes the machine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from google.protobuf import json_format

from topo_tune.agent.discovery.discover import discover
from topo_tune.agent.discovery.nvml import PynvmlBackend, RecordingNvml
from topo_tune.agent.discovery.snapshot import take_snapshot
from topo_tune.security.safe_write import write_file


def record(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    recorder = RecordingNvml(PynvmlBackend())
    topo = discover(nvml=recorder)
    recorder.save(out_dir / "nvml.json")
    write_file(out_dir / "sysfs.json", json.dumps(take_snapshot(), indent=1, sort_keys=True) + "\n")
    write_file(out_dir / "topology.json", json_format.MessageToJson(topo, indent=1) + "\n")


if __name__ == "__main__":
    record(Path(sys.argv[1]))
