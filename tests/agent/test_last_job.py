"""A worker whose process ends after its job leaves its communicator to that end, once every rank is done with it.

Destroying an NCCL communicator took about 0.5 s on an H200 (NCCL joins a proxy thread that polls every 500 ms),
so a worker the launcher will not keep skips it: every rank waits in the job's store until all are done, rank 0
(which serves that store) until every other rank has seen so, and then the process ends without finalisers.
Here: the wait's order with a real store and three ranks, and which communicators are left, kept or destroyed.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from tests.benchmark.test_gloo_jobs import _spec as gloo_job
from tests.support.processes import free_port
from topo_tune.agent.bench.kept_communicator import KeptCommunicator, _done_together, communicator_key
from topo_tune.agent.bench.worker_config import WorkerConfig
from topo_tune.benchmark.job_spec import BenchmarkSpec
from topo_tune.nccl.backends import Backend
from topo_tune.nccl.collectives import Collective
from topo_tune.plugin.job_env import WORKLOAD_ENV


def _spec(ranks: int) -> BenchmarkSpec:
    return gloo_job("last", collective=Collective.ALL_REDUCE, nodes=("n0",), ranks_per_node=ranks, iters=1)


def _config(spec: BenchmarkSpec, rank: int, tmp_path: Path, **kw: object) -> WorkerConfig:
    return WorkerConfig(
        spec=spec, rank=rank, device=-1, backend=Backend.GLOO, bind_address="127.0.0.1", rendezvous_timeout_s=30,
        progress_path=tmp_path / "p", result_path=tmp_path / "r", stderr_path=tmp_path / "e", sys_path=(),
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_no_rank_leaves_before_every_rank_is_done_and_rank_0_serves_until_the_others_saw_it(tmp_path: Path) -> None:
    spec = _spec(3)
    port = free_port()
    master = TCPStore("127.0.0.1", port, 3, is_master=True, wait_for_workers=False)
    returned: dict[int, float] = {}
    late_arrival = threading.Event()

    def rank(r: int) -> None:
        store = master if r == 0 else TCPStore("127.0.0.1", port, 3, is_master=False)
        if r == 2:
            late_arrival.wait(30)
            time.sleep(0.2)  # the others are waiting by now
        arrived = time.monotonic()
        _done_together(_config(spec, r, tmp_path, last_job=True), store=store)
        returned[r] = time.monotonic()
        if r == 2:
            returned[-1] = arrived

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    late_arrival.set()
    for t in threads:
        t.join(60)
    assert sorted(returned) == [-1, 0, 1, 2], "every rank returned"
    assert min(returned[0], returned[1]) >= returned[-1], "ranks 0 and 1 waited for the late rank 2"


def test_rank_0_serves_the_store_until_every_other_rank_saw_all_done(tmp_path: Path) -> None:
    spec = _spec(2)
    port = free_port()
    master = TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False)
    peer = TCPStore("127.0.0.1", port, 2, is_master=False)
    rank_0 = threading.Thread(
        target=_done_together, args=(_config(spec, 0, tmp_path, last_job=True),), kwargs={"store": master}
    )
    rank_0.start()
    if peer.add("topo_tune/done", 1) == 2:  # rank 1 is done, as _done_together counts it, but has not seen it all
        peer.set("topo_tune/done/all", "1")
    peer.wait(["topo_tune/done/all"])
    rank_0.join(0.5)
    assert rank_0.is_alive(), "rank 0 left while rank 1 might still ask its store"
    _done_together(_config(spec, 1, tmp_path, last_job=True), store=peer)  # rank 1 ends its wait: counted as seen
    rank_0.join(30)
    assert not rank_0.is_alive()


@pytest.mark.parametrize(
    ("last_job", "communicator_dir", "counting", "fate"),
    [
        (True, False, False, "left"),  # a process that ends after the job
        (False, True, False, "kept"),  # a kept worker with its kept communicator
        (False, False, False, "destroyed"),  # a kept worker, communicators not kept
        (True, False, True, "destroyed"),  # counting calls: the plugin writes the counts at the destroy
    ],
)
def test_a_last_jobs_communicator_is_left_to_the_process_end_unless_its_destroy_writes_counts(
    last_job: bool,
    communicator_dir: bool,
    counting: bool,
    fate: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if counting:
        monkeypatch.setenv(WORKLOAD_ENV, str(tmp_path))
    spec = _spec(1)
    config = _config(
        spec, 0, tmp_path, last_job=last_job, communicator_dir=tmp_path / "kept" if communicator_dir else None
    )
    store = TCPStore("127.0.0.1", free_port(), 1, is_master=True, wait_for_workers=False)
    held = KeptCommunicator()
    key = communicator_key(config, {})
    try:
        assert not held.join(config, store=store, ticket="", key=key)
        assert dist.is_initialized()
        held.end_of_job(config, store=store)
        assert held.left is (fate == "left")
        assert dist.is_initialized() is (fate != "destroyed")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
