"""Users outside Kubernetes never load the kubernetes client (start-up time, and it is an optional extra)."""

from __future__ import annotations

import subprocess
import sys


def test_the_daemons_and_the_cli_load_without_the_kubernetes_client() -> None:
    code = (
        "import sys; import topo_tune.cli.main, topo_tune.controller.server, topo_tune.agent.daemon; "
        "loaded = sorted(m for m in sys.modules if m == 'kubernetes' or m.startswith('kubernetes.')); "
        "print(loaded); sys.exit(1 if loaded else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
