"""Drift checks: is the fleet's config version still as fast as when its rollout verified it?

- ``checker``: ``DriftChecker``, when a check runs, on which nodes, its benchmark jobs, a study on a regression;
- ``verdict``: the status and message of a check from its figures (pure);
- ``store``: the ``drift_checks`` rows (read back as ``DriftCheck``) and a regression's events;

Their settings (interval, sample size, threshold, significance, repeats) are cluster.yaml's
``controller.drift``: ``cluster_config.DriftConfig``.
"""

from topo_tune.controller.drift.checker import DriftChecker
from topo_tune.controller.drift.verdict import DriftKind, DriftStatus
from topo_tune.drift_record import DriftCheck

__all__ = ["DriftCheck", "DriftChecker", "DriftKind", "DriftStatus"]
