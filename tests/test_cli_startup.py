"""``topo-tune admin`` and the agent start without the controller's and tuner's libraries.

Operators poll ``topo-tune admin`` in loops and every node runs an agent: each of them importing SciPy, the
database layer and Optuna would cost seconds of CPU per call on a busy machine, for code they never run.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("scipy", "sqlalchemy", "optuna", "alembic", "torch", "matplotlib")


@pytest.mark.parametrize(
    ("argv", "runs"),
    [
        pytest.param(["admin", "nodes", "--help"], "topo_tune.client.admin", id="admin"),
        # What `agent run` imports once it runs.
        pytest.param(["agent", "run", "--help"], "topo_tune.agent.daemon", id="agent"),
        pytest.param(["exec", "--help"], "topo_tune.client.admin", id="exec"),
    ],
)
def test_the_command_loads_none_of_the_heavy_libraries(argv: list[str], runs: str) -> None:
    code = (
        "import sys\n"
        "from topo_tune.cli.main import cli\n"
        f"import {runs}\n"
        f"cli.main({argv!r}, prog_name='topo-tune', standalone_mode=False)\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print(sorted({m.split('.')[0] for m in heavy}), file=sys.stderr)\n"
        "sys.exit(1 if heavy else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, f"`topo-tune {' '.join(argv)}` loaded {done.stderr.strip()[-2000:]}"


def test_the_controller_starts_without_the_drawing_and_statistics_libraries() -> None:
    # The controller needs the database layer and Optuna, but draws figures and runs SciPy's tests only when a
    # study it runs writes its outputs or a drift check compares figures: not on each of its starts.
    code = (
        "import sys\n"
        "import topo_tune.cli.controller, topo_tune.controller.server\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'scipy', 'matplotlib', 'torch'})\n"
        "print(heavy, file=sys.stderr)\n"
        "sys.exit(1 if heavy else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, f"the controller loaded {done.stderr.strip()[-2000:]}"
