"""One benchmark rank: ``python -m topo_tune.agent.bench.worker CONFIG.json`` runs one job.

The ``launcher`` starts it in its own session with exactly the job's environment, through :func:`serve`: the
worker then reads the config paths of its jobs from stdin, one a line, and after each job it finished writes one
line (the job's id) to the reply descriptor it was given, so the launcher can keep it for the next job of the
same environment (``kept_workers``). Before each job it sends its stdout and stderr to that job's file and sets
that job's per-communicator variables (``job_env``); after it, nothing of the job is left but the process and,
where ``kept_communicator`` allows, its communicator for the next job of the same membership: the job's
rendezvous store is closed, the CUDA cache emptied. A job that failed ends the process. For every job it

1. reports ``started``; connects to the job's TCPStore rendezvous (rank 0 hosts it), counts itself among
   the holders of its kept communicator, marks itself arrived and waits for every rank, reporting which ranks
   it is still waiting for;
2. reuses the communicator it kept, if every rank kept that one, else makes a new one (``nccl`` on its GPU, or
   ``gloo`` bound to the node's address; see ``kept_communicator``), and reports ``joined`` with which;
3. for every size and placement: a warm-up, one synchronising call, the timed loop (mean time per
   iteration, like nccl-tests' ``time``) and the per-iteration samples (p50/p99/CV), then the
   data check; the timed loop is timed with CUDA events on GPUs and ``perf_counter`` on CPUs.
   On GPUs the per-iteration samples come from a second loop with an event after every call,
   so that the events' launch cost never inflates the reported mean. A ``cuda_graph`` job times
   both as CUDA graphs instead (nccl-tests ``-G``, see ``_graph_loop``);
4. with NCCL's tuner plugin loaded (``nccl``), reads the plugin's record of this rank's calls and reports,
   with every size, the (algorithm, protocol) entries NCCL offered, its choice and what ran;
5. writes its result atomically and reports ``finished``.

Exit codes: 0 finished (for :func:`serve`: its stdin closed), 3 bad configuration, 4 a benchmark error
(message on stderr and in the progress file).

Non-goals: deadlines and killing (the launcher owns them), protobuf (results are JSON).
"""

from __future__ import annotations

import ctypes
import dataclasses
import datetime
import hashlib
import itertools
import json
import logging
import os
import shutil
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from topo_tune.agent.bench.collective_ops import fill_inputs, make_buffers, op_for, placement_supported, wrong_elements
from topo_tune.agent.bench.kept_communicator import KeptCommunicator, communicator_key
from topo_tune.agent.bench.worker_config import PER_COMMUNICATOR_ENV, WorkerConfig, per_job
from topo_tune.benchmark.collectives import bandwidth, shape
from topo_tune.benchmark.iteration_stats import IterationStats
from topo_tune.benchmark.job_spec import BenchmarkSpec
from topo_tune.benchmark.results import NcclChoice, RankResult, SizeMeasurement
from topo_tune.errors import RecordError
from topo_tune.nccl.backends import Backend
from topo_tune.nccl.library import loaded_version
from topo_tune.plugin.job_env import TABLE_ENV
from topo_tune.plugin.record import RecordedCall, parse_record
from topo_tune.versions.version import SYSTEM_NCCL_CONF, file_settings

__all__ = ["main", "serve"]

logger = logging.getLogger(__name__)

EXIT_BAD_CONFIG = 3
EXIT_BENCHMARK_ERROR = 4
_RENDEZVOUS_POLL = datetime.timedelta(seconds=1)
_ARRIVED_PREFIX = "topo_tune/arrived/"
_COMMUNICATOR = KeptCommunicator()
"""This process's communicator, kept between its jobs where ``kept_communicator`` allows."""


class Progress:
    """Appends one JSON line per phase change and flushes it, so a killed rank leaves a trail.

    Each line has its wall-clock time (``at``, seconds since the epoch), so a job's fixed cost can be split
    into its phases (``benchmarks/worker_reuse.py``).
    """

    def __init__(self, path: Path) -> None:
        self._file = path.open("a", encoding="utf-8")

    def report(self, phase: str, **extra: Any) -> None:
        self._file.write(json.dumps({"phase": phase, "at": round(time.time(), 4), **extra}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def await_listener(host: str, port: int, *, within_s: float) -> bool:
    """Return once something listens on ``host:port`` (True), or after ``within_s`` (False).

    A TCPStore client that finds nobody listening backs off for hundreds of milliseconds before it tries again
    (370-670 ms measured with torch 2.13), and a rank often reaches the job's store a moment before rank 0 has
    bound it (kept workers get their jobs at once): that wait was most of some kept jobs' fixed cost. Probing
    with plain connections, 1 ms apart at first and at most 50 ms apart, connects the store the moment it
    listens. Anything but a refusal (a host that does not answer) is left to the store's own retries.
    """
    deadline = time.monotonic() + within_s
    pause = 0.001
    while True:
        left = deadline - time.monotonic()
        try:
            socket.create_connection((host, port), timeout=max(0.01, min(1.0, left))).close()
            return True
        except ConnectionRefusedError:
            if left <= 0:
                return False
        except OSError:
            return False
        time.sleep(min(pause, max(0.0, left)))
        pause = min(pause * 2, 0.05)


def _rendezvous(config: WorkerConfig, progress: Progress, *, ticket: str) -> TCPStore:
    """Connect to the job's store and wait for every rank; first count this rank under ``ticket``, if any."""
    spec = config.spec
    timeout = datetime.timedelta(seconds=config.rendezvous_timeout_s)
    progress.report("rendezvous", host=spec.rendezvous_host, port=spec.rendezvous_port)
    if config.rank != 0:
        await_listener(spec.rendezvous_host, spec.rendezvous_port, within_s=config.rendezvous_timeout_s)
    store = TCPStore(
        spec.rendezvous_host,
        spec.rendezvous_port,
        spec.world_size,
        is_master=config.rank == 0,
        timeout=timeout,
        wait_for_workers=False,
    )
    if ticket:
        store.add(ticket, 1)  # before arriving: once all ranks have arrived, every count is final
    store.set(f"{_ARRIVED_PREFIX}{config.rank}", "1")
    keys = [f"{_ARRIVED_PREFIX}{r}" for r in range(spec.world_size)]
    while True:
        # Who is missing is reported before each wait, so a rank killed at the deadline names them even
        # when the deadline came before its first wait ran out.
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        if missing:
            progress.report("rendezvous", waiting_for=missing)
        try:
            store.wait(keys, _RENDEZVOUS_POLL)
            return store
        except (RuntimeError, dist.DistStoreError):
            continue


def _timed_loop(op: Callable[[], None], iters: int, *, cuda: bool) -> tuple[float, list[float]]:
    """Mean seconds per call over ``iters`` calls, plus per-call samples (CPU only)."""
    if cuda:
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(iters):
            op()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters, []
    stamps = [0.0] * (iters + 1)
    stamps[0] = time.perf_counter()
    for i in range(iters):
        op()
        stamps[i + 1] = time.perf_counter()
    samples = [b - a for a, b in itertools.pairwise(stamps)]
    return (stamps[-1] - stamps[0]) / iters, samples


def _cuda_samples(op: Callable[[], None], iters: int) -> list[float]:
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]  # type: ignore[no-untyped-call]
    events[0].record()
    for i in range(iters):
        op()
        events[i + 1].record()
    events[-1].synchronize()
    return [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(events)]


def _graph_loop(op: Callable[[], None], iters: int, device: torch.device) -> tuple[float, list[float]]:
    """nccl-tests ``-G``: ``iters`` calls captured in one CUDA graph, timed as one replay.

    The mean comes from a graph of the calls alone; the per-call samples from a second graph with
    an event after every call, so that the events never inflate the mean. Replaying a graph costs
    the CPU one launch, so a size the GPUs finish faster than Python can issue calls is timed at
    the GPUs' speed (eager timing measures the CPU there).

    One graph at a time, each destroyed before any other NCCL call: eager collectives issued while
    a graph holding NCCL work is alive hung on the H200 record, and a second live graph slowed
    every replayed call by about 2 us.
    """
    stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    graph = torch.cuda.CUDAGraph()
    # thread_local: the process group's watchdog thread may query older events while we capture.
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        for _ in range(iters):
            op()
    with torch.cuda.stream(stream):
        graph.replay()  # the first replay uploads the graph; time the second
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize(device)
    del graph
    events = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(iters + 1)]  # type: ignore[no-untyped-call]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        events[0].record()
        for event in events[1:]:
            op()
            event.record()
    with torch.cuda.stream(stream):
        graph.replay()
    torch.cuda.synchronize(device)
    del graph
    samples = [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(events)]
    return start.elapsed_time(end) / 1e3 / iters, samples


def _measure(
    spec: BenchmarkSpec, *, size: int, in_place: bool, rank: int, device: torch.device, corrupt: bool
) -> SizeMeasurement:
    cuda = device.type == "cuda"
    torch_dtype = getattr(torch, spec.dtype.name)
    shp = shape(spec.collective, size_bytes=size, element_size=spec.dtype.size, nranks=spec.world_size)
    buffers = make_buffers(spec.collective, shape=shp, in_place=in_place, rank=rank, dtype=torch_dtype, device=device)
    op = op_for(spec.collective, buffers, rank=rank, world_size=spec.world_size)
    for _ in range(spec.warmup_iters):
        op()
    # One call that every rank must enter before anyone starts its clock (nccl-tests' Barrier).
    op()
    if cuda:
        torch.cuda.synchronize(device)
    if spec.cuda_graph:
        seconds, samples = _graph_loop(op, spec.iters, device)
    else:
        seconds, samples = _timed_loop(op, spec.iters, cuda=cuda)
        if cuda:
            samples = _cuda_samples(op, spec.iters)
    stats = IterationStats.from_samples([s * 1e6 for s in samples])
    wrong = 0
    if spec.check:
        fill_inputs(spec.collective, buffers, rank=rank)
        if cuda:
            torch.cuda.synchronize(device)
        op()
        if cuda:
            torch.cuda.synchronize(device)
        if corrupt and buffers.recv.numel():
            buffers.recv.view(-1)[0] += 1
        wrong = wrong_elements(
            spec.collective, buffers, shape=shp, rank=rank, world_size=spec.world_size, dtype=spec.dtype
        )
    algbw, busbw = bandwidth(spec.collective, shape=shp, seconds=seconds, nranks=spec.world_size)
    return SizeMeasurement(
        bytes=shp.reported_bytes,
        count=shp.param_count,
        in_place=in_place,
        time_us=seconds * 1e6,
        algbw_gbps=algbw,
        busbw_gbps=busbw,
        wrong=wrong,
        checked=spec.check,
        p50_us=stats.p50_us,
        p99_us=stats.p99_us,
        cv=stats.cv,
    )


def _placements(spec: BenchmarkSpec) -> tuple[bool, ...]:
    runnable = tuple(p for p in spec.placements if placement_supported(spec.collective, p))
    if runnable or len(spec.placements) > 1:
        return runnable
    # A single placement the backend cannot run falls back to the one it can (see collective_ops).
    return (not spec.placements[0],)


def process_environ() -> dict[str, str]:
    """The C library's environment of this process, which is what NCCL reads.

    NCCL copies the ``KEY=VALUE`` lines of ``NCCL_CONF_FILE`` (else ``~/.nccl.conf``) and
    ``/etc/nccl.conf`` into the process environment with ``setenv`` when it initialises, for keys
    not already set; ``os.environ`` is Python's snapshot from start-up and never sees them.
    """
    libc = ctypes.CDLL(None)
    environ = ctypes.POINTER(ctypes.c_char_p).in_dll(libc, "environ")
    out: dict[str, str] = {}
    i = 0
    while (entry := environ[i]) is not None:
        key, _, value = entry.decode("utf-8", "replace").partition("=")
        out[key] = value
        i += 1
    return out


def _effective_env(spec: BenchmarkSpec, backend: Backend) -> dict[str, str]:
    """The job's variables and every NCCL one as NCCL saw them (nccl.conf included), versions, the table's digest.

    NCCL always also reads ``/etc/nccl.conf`` (``NCCL_CONF_FILE`` does not stop it), so what it would add from
    its files is recorded too, on a backend whose NCCL never started as well, with the system file's digest.
    """
    env = {k: v for k, v in process_environ().items() if k in spec.env or k.startswith(("NCCL_", "TORCH_NCCL_"))}
    for key, value in file_settings(os.environ, system_conf=SYSTEM_NCCL_CONF).items():
        env.setdefault(key, value)
    try:
        env["topo_tune.system_nccl_conf_sha256"] = hashlib.sha256(SYSTEM_NCCL_CONF.read_bytes()).hexdigest()
    except OSError:
        env["topo_tune.system_nccl_conf_sha256"] = "absent"
    env["topo_tune.backend"] = backend.value
    table = os.environ.get(TABLE_ENV)
    if table:
        # What this rank's NCCL will read, so a result proves every rank ran the same candidate table.
        try:
            env["topo_tune.tuner_table_sha256"] = hashlib.sha256(Path(table).read_bytes()).hexdigest()
        except OSError as exc:
            env["topo_tune.tuner_table_sha256"] = f"unreadable: {exc.strerror}"
    env["topo_tune.torch_version"] = torch.__version__
    if backend.runs_nccl:
        # The library that ran; torch's own figure is the NCCL it was built against (kept when none is loaded).
        built = ".".join(str(v) for v in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
        env["topo_tune.nccl_version"] = loaded_version() or built
    return env


def with_choices(spec: BenchmarkSpec, sizes: list[SizeMeasurement], record: Path) -> list[SizeMeasurement]:
    """``sizes`` with NCCL's choice from the tuner plugin's record, where it recorded the size's call.

    The job's own communicator is the one over every rank; NCCL's nBytes for a call is the size nccl-tests
    reports (all_gather and reduce_scatter: the whole buffer). A missing or unreadable record leaves the
    sizes as they are: the record is a report, the measurement stands without it.
    """
    try:
        calls = parse_record(record.read_text(encoding="utf-8"), source=record.name)
    except (OSError, UnicodeDecodeError, RecordError) as exc:
        logger.warning("no record of NCCL's choices: %s", exc)
        return sizes
    name = spec.collective.value.replace("_", "")
    # A CUDA-graph job's timed calls run captured, and NCCL passes a tuner regBuff 1 while capturing with
    # NCCL_GRAPH_REGISTER on (the default; src/enqueue.cc ncclGetAlgoInfo), so its choice may differ from the
    # eager warm-up's. Prefer the record of the calls that were timed.
    timed_reg_buff = 1 if spec.cuda_graph else 0
    mine: dict[int, RecordedCall] = {}
    for call in calls:
        if call.collective == name and call.n_ranks == spec.world_size and call.num_pipe_ops == 1:
            known = mine.get(call.bytes)
            if known is None or (known.reg_buff != timed_reg_buff and call.reg_buff == timed_reg_buff):
                mine[call.bytes] = call
    out = []
    for m in sizes:
        found = mine.get(m.bytes)
        if found is None:
            out.append(m)
            continue
        choice = NcclChoice(found.offered, found.nccl, found.applied, found.channels or 0)
        out.append(dataclasses.replace(m, choice=choice))
    return out


def run(config: WorkerConfig, progress: Progress) -> RankResult:
    spec = config.spec
    if config.fault.hang_before_join_rank == config.rank:
        progress.report("started", fault="hang_before_join")
        threading.Event().wait()  # test-only fault: never returns; the launcher kills us
    key = communicator_key(config, os.environ)
    ticket = _COMMUNICATOR.ticket(key, config.rank)
    store = _rendezvous(config, progress, ticket=ticket)
    if config.backend.runs_nccl:
        device = torch.device("cuda", config.device)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    kept = _COMMUNICATOR.join(config, store=store, ticket=ticket, key=key)
    progress.report("joined", communicator="kept" if kept else "new", communicators_made=_COMMUNICATOR.made)
    sizes = []
    corrupt = config.fault.corrupt_rank == config.rank
    for size in spec.sweep.sizes():
        for in_place in _placements(spec):
            progress.report("running", bytes=size, in_place=in_place)
            sizes.append(_measure(spec, size=size, in_place=in_place, rank=config.rank, device=device, corrupt=corrupt))
    dist.barrier()
    record = _COMMUNICATOR.record
    if record is not None:
        job_record = config.result_path.with_name("tuner_record.csv")
        if record != job_record and record.exists():
            shutil.copyfile(record, job_record)  # the job's directory shows what its choices were read from
        sizes = with_choices(spec, sizes, record)
    result = RankResult(
        job_id=spec.job_id,
        rank=config.rank,
        sizes=tuple(sizes),
        effective_env=_effective_env(spec, config.backend),
    )
    tmp = config.result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result.to_json()))
    os.replace(tmp, config.result_path)
    progress.report("finished")
    _COMMUNICATOR.end_of_job(config, store=store)
    # What a kept worker must not carry into its next job: this job's store (rank 0 serves it on the job's
    # port; the last reference goes here, which closes it) and its buffers in the CUDA cache. No gc.collect():
    # it took 0.4 s of a 1 s job in a process holding torch, and nothing here is held by a cycle.
    del store
    if config.backend.runs_nccl:
        torch.cuda.empty_cache()
    return result


def _redirect_output(path: Path) -> None:
    """Send this process's stdout and stderr (Python's, NCCL's, torch's) to ``path``, appended."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _run_job(config: WorkerConfig, *, jobs_before: int) -> int:
    """Run one job in this process; the exit code :func:`main` would return for it."""
    _redirect_output(config.stderr_path)
    for key in {*PER_COMMUNICATOR_ENV, *(k for k in os.environ if per_job(k, config.backend))}:
        os.environ.pop(key, None)  # unset for the job unless it sets it
    os.environ.update(config.job_env)
    progress = Progress(config.progress_path)
    if config.cpus:
        os.sched_setaffinity(0, config.cpus)
    # Keys and a digest (not values) of the environment, so isolation can be audited per rank.
    env_digest = hashlib.sha256(json.dumps(sorted(os.environ.items())).encode()).hexdigest()
    progress.report(
        "started",
        pid=os.getpid(),
        jobs_before=jobs_before,
        env_keys=sorted(os.environ),
        env_digest=env_digest,
        cpus=sorted(os.sched_getaffinity(0)),
    )
    try:
        run(config, progress)
    except Exception as exc:
        traceback.print_exc()
        progress.report("failed", error=f"{type(exc).__name__}: {exc}")
        return EXIT_BENCHMARK_ERROR
    finally:
        progress.close()
    return 0


def _load(path: str) -> WorkerConfig | None:
    try:
        return WorkerConfig.load(Path(path))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        print(f"bad worker config {path}: {exc}", file=sys.stderr)
        return None


def serve(replies: int) -> int:
    """Run the jobs whose config paths arrive on stdin until it closes; one line to ``replies`` after each.

    Returns at the first job that did not finish (its exit code): a worker that failed is never reused.
    """
    for jobs_run, line in enumerate(sys.stdin):
        config = _load(line.strip())
        if config is None:
            return EXIT_BAD_CONFIG
        code = _run_job(config, jobs_before=jobs_run)
        if code != 0:
            return code
        os.write(replies, f"{config.spec.job_id}\n".encode())
    return _ended(0)


def _ended(code: int) -> int:
    """``code``; but a process whose communicator was left to its end ends here, without Python's finalisers (they
    would destroy it: ``kept_communicator``)."""
    if _COMMUNICATOR.left:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def main(argv: list[str] | None = None) -> int:
    """One job, from the config file named on the command line."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m topo_tune.agent.bench.worker CONFIG.json", file=sys.stderr)
        return EXIT_BAD_CONFIG
    config = _load(args[0])
    if config is None:
        return EXIT_BAD_CONFIG
    return _ended(_run_job(config, jobs_before=0))


if __name__ == "__main__":
    sys.exit(main())
