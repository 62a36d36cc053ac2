"""A study in a child process, for the kill-and-resume test: ``python -m tests.tuner.study_worker DB MARKER N``.

It runs the synthetic study and, on its N-th search measurement, writes MARKER and blocks forever (the
parent then kills it with SIGKILL, mid-trial).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from tests.tuner.landscape import Landscape, synthetic_space
from tests.tuner.test_study import study_settings, synthetic_objective
from topo_tune.tuner.objective import Measurements
from topo_tune.tuner.space import TrialConfig
from topo_tune.tuner.study import MeasurementRequest, run_study


def main() -> None:
    database, marker, stop_at = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    landscape = Landscape()

    def evaluate(config: TrialConfig, request: MeasurementRequest) -> Measurements:
        if request.purpose == "search" and landscape.calls["search"] + 1 == stop_at:
            marker.write_text(str(request.trial))
            threading.Event().wait()  # hang here until killed
        return landscape(config, request)

    run_study(study_settings(database), space=synthetic_space(), objective=synthetic_objective(), evaluate=evaluate)


if __name__ == "__main__":
    main()
