"""A local demo cluster: one controller and four `sim` agents in two racks, on loopback, with SQLite.

It starts the real daemons through the real CLI, waits for every node to be ready, shows them with
`topo-tune admin nodes`, sends a command to one agent, shows its result, and stops everything. Nothing
is left running; the state lives in a temporary directory that is removed at the end.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NODES = {"node-a1": "rack-a", "node-a2": "rack-a", "node-b1": "rack-b", "node-b2": "rack-b"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    env = {**os.environ, "TOPO_TUNE_TOKEN": secrets.token_hex(16), "PYTHONUNBUFFERED": "1"}
    cli = [sys.executable, "-m", "topo_tune"]
    address = f"127.0.0.1:{free_port()}"
    env["TOPO_TUNE_CONTROLLER"] = address
    daemons: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="topo-tune-demo-") as tmp:
        work = Path(tmp)
        log = (work / "daemons.log").open("wb")
        try:
            print(f"==> starting the controller on {address} (SQLite in {work})")
            daemons.append(
                subprocess.Popen(
                    [
                        *cli,
                        "controller",
                        "serve",
                        "--listen",
                        address,
                        "--database",
                        f"sqlite:///{work}/demo.db",
                        "--heartbeat-interval",
                        "1",
                        "--heartbeat-expiry",
                        "5",
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            for node, rack in NODES.items():
                print(f"==> starting agent {node} in {rack} (backend sim)")
                daemons.append(
                    subprocess.Popen(
                        [
                            *cli,
                            "agent",
                            "run",
                            "--node-name",
                            node,
                            "--rack",
                            rack,
                            "--backend",
                            "sim",
                            "--state-dir",
                            str(work / node),
                            "--config-dir",
                            str(work / node / "config"),
                        ],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
            deadline = time.monotonic() + 60
            while True:
                out = subprocess.run(
                    [*cli, "admin", "nodes", "-o", "json"], env=env, capture_output=True, text=True, check=False
                )
                if out.returncode == 0 and out.stdout.count('"NODE_STATE_READY"') == len(NODES):
                    break
                if time.monotonic() > deadline:
                    print("demo: the nodes did not become ready; daemon log follows", file=sys.stderr)
                    print((work / "daemons.log").read_text(), file=sys.stderr)
                    return 1
                time.sleep(0.3)
            print("==> topo-tune admin nodes")
            subprocess.run([*cli, "admin", "nodes"], env=env, check=True)
            print("==> topo-tune admin rediscover node-a1 --id demo-rediscover")
            subprocess.run([*cli, "admin", "rediscover", "node-a1", "--id", "demo-rediscover"], env=env, check=True)
            while (
                "succeeded"
                not in subprocess.run(
                    [*cli, "admin", "command", "demo-rediscover"], env=env, capture_output=True, text=True, check=False
                ).stdout
            ):
                time.sleep(0.2)
            print("==> topo-tune admin command demo-rediscover")
            subprocess.run([*cli, "admin", "command", "demo-rediscover"], env=env, check=True)
            print("==> topo-tune admin node node-a1")
            subprocess.run([*cli, "admin", "node", "node-a1"], env=env, check=True)
            return 0
        finally:
            for daemon in reversed(daemons):
                daemon.send_signal(signal.SIGTERM)
            for daemon in daemons:
                daemon.wait(30)
            log.close()
            print("==> stopped the controller and the agents")


if __name__ == "__main__":
    sys.exit(main())
