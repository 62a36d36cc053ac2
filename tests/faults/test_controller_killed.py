"""SIGKILL of an external controller while ``topo-tune init`` runs its pass through it: once during the search,
once during the proof. ``init`` says it waits, rides out each restart, and ends as an uninterrupted pass would:
every trial of the budget counted once, the proof's pairs stored once each, nothing lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from tests.faults.figures import record
from tests.support.processes import LocalCluster, cli_env
from tests.support.waiting import wait_until
from tests.test_init import small_demo

pytestmark = [pytest.mark.faults_long, pytest.mark.slow]  # two minutes of init: run when named

BUDGET = 6
RACKS = {"node-01": "rack-a", "node-03": "rack-a", "node-02": "rack-b", "node-04": "rack-b"}


def _count(database: Path, query: str) -> int:
    if not database.exists():
        return 0
    engine = sa.create_engine(f"sqlite:///{database}")
    try:
        with engine.connect() as connection:
            return int(connection.execute(sa.text(query)).scalar_one())
    except sa.exc.OperationalError:
        return 0  # the study's tables are not there yet
    finally:
        engine.dispose()


def _restart(cluster: LocalCluster) -> None:
    assert cluster.controller is not None
    cluster.controller.kill()  # SIGKILL: no goodbye to the pass, the agents or the database
    time.sleep(2.0)  # the pass sees a controller that is gone for a while, not a blip
    cluster.start_controller(timeout=90)


def test_init_rides_out_an_external_controller_killed_during_the_search_and_the_proof(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, f"sqlite:///{tmp_path / 'controller.db'}")
    try:
        cluster.start_controller(timeout=90)
        for name, rack in RACKS.items():
            cluster.start_agent(name, rack=rack)
        config = small_demo(budget=BUDGET)
        config["controller"] = {"address": cluster.address}
        cluster_file = tmp_path / "cluster.yaml"
        cluster_file.write_text(yaml.safe_dump(config))
        output = tmp_path / "out"
        log = tmp_path / "init.log"
        command = [sys.executable, "-m", "topo_tune", "init", "--cluster-config", str(cluster_file)]
        with log.open("wb") as out:
            init = subprocess.Popen([*command, "--output", str(output)], env=cli_env(), stdout=out, stderr=out)
        study = output / "study.db"

        def trials() -> int:
            return _count(study, "SELECT count(*) FROM trials WHERE state = 'COMPLETE'")

        def proof_pairs() -> int:
            return _count(study, "SELECT count(*) FROM study_user_attributes WHERE key LIKE 'proof:%'")

        wait_until(lambda: trials() >= 3 or init.poll() is not None, timeout=240, interval=0.5, what="3 trials")
        assert init.poll() is None, log.read_text()[-3000:]
        _restart(cluster)
        wait_until(lambda: proof_pairs() >= 1 or init.poll() is not None, timeout=300, interval=0.3, what="proof")
        assert init.poll() is None, log.read_text()[-3000:]
        _restart(cluster)

        assert init.wait(300) == 0, log.read_text()[-3000:]
        said = log.read_text() + (output / ".topo-tune" / "init.log").read_text()  # the terminal's lines, the log's
        # Each outage said so: a call waits ("waiting up to 120 s ..."), a wait on a job watches again.
        told = said.count("waiting up to 120 s for the controller to answer") + said.count("lost the controller while")
        assert told >= 2, said[-3000:]
        summary = json.loads((output / "summary.json").read_text())
        after_budget = ("table", "option", "per_size")
        counted = [t for t in summary["trials"] if not t["superseded"] and t["role"] not in after_budget]
        assert len(counted) == BUDGET, "every trial of the budget counted once, none lost"
        assert len({t["number"] for t in summary["trials"]}) == len(summary["trials"]), "no trial number twice"
        keys = _count(study, "SELECT count(DISTINCT key) FROM study_user_attributes WHERE key LIKE 'proof:%'")
        assert keys == proof_pairs() >= 1, "each proof pair stored once"
        record("controller SIGKILL during init's search and proof", faults=2, resumes=2, rows=len(summary["trials"]))
    finally:
        cluster.stop()
