"""The tuning pass of ``topo-tune init`` as the controller's studies run it, handed to the controller it serves.

The controller defines what it needs of a pass (``controller.studies.StudyPass``) and never imports the tuning
pass; the commands that build a serving controller give it this one. Non-goals: the study's life cycle
(``controller/studies.py``) and the pass itself (``tuning_pass/run.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from topo_tune.config.cluster import ClusterConfig
from topo_tune.controller.studies import StudyEnd
from topo_tune.tuner.study import StudyProgress
from topo_tune.tuner.study_summary import verdict_lines
from topo_tune.tuning_pass.controller_port import AdminPort
from topo_tune.tuning_pass.run import run_pass


class InitPass:
    """``run_pass`` over the controller's in-process port, its result as the study row keeps it."""

    def run(
        self,
        cluster: ClusterConfig,
        port: AdminPort,
        *,
        output: Path,
        storage: str,
        on_progress: Callable[[StudyProgress], None],
    ) -> StudyEnd:
        passed = run_pass(cluster, port, output=output, storage=storage, on_progress=on_progress)
        outcome = passed.outcome
        verdict = "; ".join(" ".join(line.split()) for line in verdict_lines(outcome))
        return StudyEnd(
            promoted=outcome.chosen is not None,
            config_version=passed.written.config_version.id,
            optuna_name=outcome.name,
            summary=f"{len(outcome.trials)} trials; {verdict}",
        )
