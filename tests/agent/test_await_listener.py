"""A rank that reaches the job's store before rank 0 has bound it connects once rank 0 listens.

torch's TCPStore client backs off for hundreds of milliseconds after a refused connection, which was most of
some kept jobs' fixed cost on the GPU; the worker probes the port first (``worker.await_listener``). What
that buys is measured by ``benchmarks/worker_reuse.py`` (its "rendezvous + communicator" column), not here.
"""

from __future__ import annotations

import datetime
import socket
import threading
import time

from torch.distributed import TCPStore  # type: ignore[attr-defined]

from tests.support.processes import free_port
from topo_tune.agent.bench.worker import await_listener


def test_a_store_bound_after_the_rank_arrived_is_found_and_the_rank_connects_to_it() -> None:
    port = free_port()
    stores: list[TCPStore] = []
    arrived = threading.Event()

    def rank0() -> None:
        arrived.wait(10)
        time.sleep(0.05)  # rank 0 binds its store after the other rank has started waiting
        stores.append(TCPStore("127.0.0.1", port, 2, True, datetime.timedelta(seconds=30), wait_for_workers=False))

    host = threading.Thread(target=rank0)
    host.start()
    arrived.set()
    assert await_listener("127.0.0.1", port, within_s=30)
    socket.create_connection(("127.0.0.1", port), timeout=1).close()  # it returned because rank 0 listens
    host.join()
    client = TCPStore("127.0.0.1", port, 2, False, datetime.timedelta(seconds=30))
    client.set("arrived/1", "1")
    assert stores[0].get("arrived/1") == b"1"  # the probe connection left the store serving


def test_nobody_listening_is_reported_once_the_time_is_up_and_a_listener_at_once() -> None:
    port = free_port()
    assert not await_listener("127.0.0.1", port, within_s=0.2)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        assert await_listener("127.0.0.1", port, within_s=0)
