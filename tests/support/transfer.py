"""A bulk TCP transfer between two hosts of a namespace cluster: the plain measurement of a shaped link.

``python -m tests.support.transfer receive ADDR PORT`` listens, prints ``listening`` once it does, and
prints the received rate (Mbit/s, 10^6 bit/s) when the sender closes; ``send ADDR PORT BYTES`` connects and
sends. The rate is timed at the receiver from the first byte to the end, so connection set-up is not in
it. ``measure`` runs any number of such transfers at once (flows that share a link share its rate).

Non-goals: latency, UDP, anything iperf does beyond one number per flow.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.support.netns import NetnsCluster

_CHUNK = 1 << 20
_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Flow:
    """One transfer as its receiver saw it; ``started``/``ended`` are on the machine's monotonic clock,
    which every namespace shares, so flows of one ``measure`` call can be laid side by side."""

    received: int
    started: float
    ended: float

    @property
    def mbit(self) -> float:
        return self.received * 8 / (self.ended - self.started) / 1e6


def aggregate_mbit(flows: Sequence[Flow]) -> float:
    """All flows' bytes over the time from the first one's start to the last one's end."""
    span = max(f.ended for f in flows) - min(f.started for f in flows)
    return sum(f.received for f in flows) * 8 / span / 1e6


def receive(address: str, port: int) -> Flow:
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((address, port))
        server.listen(1)
        print("listening", flush=True)
        connection, _ = server.accept()
        with connection:
            connection.recv(_CHUNK)  # the first chunk starts the clock; only what comes after it is timed
            started = time.monotonic()
            received = 0
            while chunk := connection.recv(_CHUNK):
                received += len(chunk)
            return Flow(received, started, time.monotonic())


def send(address: str, port: int, size: int) -> None:
    payload = b"\0" * _CHUNK
    with socket.create_connection((address, port), timeout=30) as connection:
        for offset in range(0, size, _CHUNK):
            connection.sendall(payload[: min(_CHUNK, size - offset)])


def measure(cluster: NetnsCluster, flows: Sequence[tuple[str, str]], *, seconds: float = 0.8) -> list[Flow]:
    """A transfer over each (source, destination) pair at the same time, each sized to last ``seconds``
    at its path's configured rate when it runs alone; each flow's figures."""
    module = [sys.executable, "-m", "tests.support.transfer"]
    receivers = []
    for index, (_source, destination) in enumerate(flows):
        receiver = cluster.popen_in(
            destination, [*module, "receive", cluster.address(destination), str(5201 + index)], cwd=_ROOT
        )
        assert receiver.stdout is not None
        line = receiver.stdout.readline().strip()
        assert line == "listening", (
            f"receiver on {destination}: {line!r} {receiver.stderr.read() if receiver.stderr else ''}"
        )
        receivers.append(receiver)
    senders = []
    for index, (source, destination) in enumerate(flows):
        size = str(int(cluster.shape.path_mbit(source, destination) * 1e6 / 8 * seconds))
        argv = [*module, "send", cluster.address(destination), str(5201 + index), size]
        senders.append(cluster.popen_in(source, argv, cwd=_ROOT))
    for sender in senders:
        _, error = sender.communicate(timeout=120)
        assert sender.returncode == 0, error
    rates = []
    for receiver in receivers:
        out, error = receiver.communicate(timeout=120)
        assert receiver.returncode == 0, error
        received, started, ended = out.split()
        rates.append(Flow(int(received), float(started), float(ended)))
    return rates


if __name__ == "__main__":
    role, bind, port_text, *rest = sys.argv[1:]
    if role == "receive":
        flow = receive(bind, int(port_text))
        print(flow.received, flow.started, flow.ended, flush=True)
    else:
        send(bind, int(port_text), int(rest[0]))
