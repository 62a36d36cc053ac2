"""Outputs written on a full disk, in a child process: ``python -m tests.tuner.output_writer DB DIR LIMIT``.

It resumes the finished synthetic study in DB and writes its outputs into DIR again, for another NCCL
version, with files limited to LIMIT bytes (RLIMIT_FSIZE, SIGXFSZ ignored: a write past the limit fails
the way one on a full disk does). Exits 3 when writing failed (``FileWriteError`` naming the file), 0 when it
succeeded.
"""

from __future__ import annotations

import resource
import signal
import sys
from pathlib import Path

from tests.tuner.landscape import NODES, Landscape, synthetic_space
from tests.tuner.test_study import study_settings, synthetic_objective
from topo_tune.errors import FileWriteError
from topo_tune.topology.distance import PairMatrix
from topo_tune.tuner.outputs import ClusterShape, write_outputs
from topo_tune.tuner.study import run_study


def shape() -> ClusterShape:
    bandwidth = tuple(tuple(0.0 if a == b else 20.0 for b in NODES) for a in NODES)
    return ClusterShape(dict.fromkeys(NODES, 8), PairMatrix.from_matrices(NODES, bandwidth, method="test"))


def main() -> None:
    database, directory, limit = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    settings = study_settings(database, budget=4, finalists=1, proof_pairs=2)
    outcome = run_study(settings, space=synthetic_space(), objective=synthetic_objective(), evaluate=Landscape())
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        write_outputs(outcome, directory, shape=shape(), nccl_version="2.29.1", topology_fingerprint="t", plots=False)
    except FileWriteError as error:
        print(error, file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
