"""``topo-tune admin bench``: run a collective micro-benchmark across nodes (optionally with a candidate tuner-plugin
table) and show it like nccl-tests."""

from __future__ import annotations

import re
from pathlib import Path

import click

from topo_tune.benchmark.dtypes import dtype_named
from topo_tune.benchmark.job_record import BenchmarkJob, BenchmarkRequest, JobStatus, SizeRange
from topo_tune.benchmark.table import TableContext, render_table
from topo_tune.cli.admin import admin, connected
from topo_tune.cli.output import emit_data, emit_line, emit_lines, emit_table
from topo_tune.cli.progress import progress_lines
from topo_tune.client.admin import AdminClient
from topo_tune.errors import ControllerError, TunerTableError
from topo_tune.ids import JobId
from topo_tune.nccl.collectives import Collective
from topo_tune.plugin.table import parse_tuner_table
from topo_tune.wire.admin_jobs import benchmark_job_data

_SIZE = re.compile(r"^(\d+)([KMG]?)B?\Z", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MAX_SIZE = (1 << 64) - 1
"""The largest size the wire can carry (an unsigned 64-bit field)."""


class ByteSize(click.ParamType):  # type: ignore[type-arg]
    """``8``, ``64K``, ``1M``, ``4G`` (powers of 1024, like nccl-tests' -b/-e)."""

    name = "size"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = _SIZE.match(str(value).strip())
        if match is None:
            self.fail(f"{value!r} is not a size like 8, 64K, 1M or 4G", param, ctx)
        size = int(match.group(1)) * _UNITS[match.group(2).upper()]
        if size > MAX_SIZE:
            self.fail(f"{value!r} is larger than the largest size, {MAX_SIZE} bytes", param, ctx)
        return size


class TunerTableFile(click.ParamType):  # type: ignore[type-arg]
    """A candidate tuner-plugin table: read and checked with the plugin's rules here, before any job starts."""

    name = "file"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        path = Path(str(value))
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.fail(f"cannot read {path}: {exc}", param, ctx)
        try:
            rows = parse_tuner_table(text, source=str(path))
        except TunerTableError as exc:
            self.fail(str(exc), param, ctx)
        if not rows:
            # The plugin would load and change nothing: surely not the table that was meant.
            self.fail(f"{path}: no table rows (only comments, blank lines or the header)", param, ctx)
        return text


def _table(job: BenchmarkJob) -> str:
    rows = list(job.sizes)
    sizes = sorted(r.bytes for r in rows) or [0]
    context = TableContext(
        collective=job.collective,
        dtype=dtype_named(job.dtype or "float32"),
        nranks=job.world_size,
        min_bytes=job.sizes_requested.min_bytes or sizes[0],
        max_bytes=job.sizes_requested.max_bytes or sizes[-1],
        step_factor=job.sizes_requested.step_factor or 2,
        warmup_iters=job.warmup_iters,
        iters=job.iters,
        check=any(r.checked for r in rows),
        simulated=job.simulated,
        cuda_graph=job.cuda_graph,
    )
    return render_table(context, rows)


def _print_job(job: BenchmarkJob, fmt: str) -> None:
    if fmt != "table":
        emit_data(benchmark_job_data(job), fmt)
        return
    emit_line(f"# job {job.job_id} on {', '.join(job.nodes)}: {job.status.value}")
    if job.message:
        emit_line(f"# {job.message}")
    if job.missing_ranks:
        emit_line(f"# missing ranks: {', '.join(map(str, job.missing_ranks))}")
    if job.hung_ranks:
        emit_line(f"# hung ranks (killed at the deadline): {', '.join(map(str, job.hung_ranks))}")
    if job.tuner_table_sha256:
        emit_line(f"# tuner table sha256 {job.tuner_table_sha256} (loaded by every rank through the plugin)")
    if job.sizes:
        emit_lines(_table(job), nl=False)


@admin.group()
def bench() -> None:
    """Collective micro-benchmarks across nodes, printed like NVIDIA's nccl-tests."""


@bench.command("run")
@click.option("--collective", type=click.Choice([c.value for c in Collective]), default="all_reduce", show_default=True)
@click.option("--nodes", required=True, help="Comma-separated node names, in rank order.")
@click.option(
    "--min-bytes", "-b", type=ByteSize(), default="8", show_default=True, help="Smallest size (nccl-tests -b)."
)
@click.option("--max-bytes", "-e", type=ByteSize(), default="64M", show_default=True, help="Largest size (-e).")
@click.option(
    "--step-factor", "-f", type=click.IntRange(1, 1024), default=2, show_default=True, help="Multiplier (-f)."
)
@click.option("--dtype", default="float32", show_default=True)
@click.option("--iters", "-n", type=click.IntRange(1, 10_000), default=20, show_default=True)
@click.option("--warmup-iters", "-w", type=click.IntRange(0, 10_000), default=5, show_default=True)
@click.option("--ranks-per-node", type=click.IntRange(0, 1024), default=0, help="0: every GPU (nccl), 1 (gloo).")
@click.option("--env", "env_pairs", multiple=True, help="NCCL_KEY=VALUE for every rank; repeatable.")
@click.option("--in-place/--out-of-place-only", default=False, help="Also run in-place, like nccl-tests.")
@click.option(
    "--cuda-graph/--eager",
    default=False,
    show_default=True,
    help="Time each size as one CUDA graph of --iters calls (nccl-tests -G; nccl backend only). "
    "Eager timing of sizes the GPUs finish in tens of microseconds measures how fast Python issues calls.",
)
@click.option("--deadline", type=click.IntRange(1, 86_400), default=600, show_default=True, help="Seconds.")
@click.option(
    "--tuner-table",
    type=TunerTableFile(),
    default=None,
    help="A candidate tuner-plugin table (nccl_tuner.conf format) every rank loads through topo-tune's plugin.",
)
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait for the result and print it.")
@connected
def run(
    client: AdminClient,
    fmt: str,
    collective: str,
    nodes: str,
    min_bytes: int,
    max_bytes: int,
    step_factor: int,
    dtype: str,
    iters: int,
    warmup_iters: int,
    ranks_per_node: int,
    env_pairs: tuple[str, ...],
    in_place: bool,
    cuda_graph: bool,
    deadline: int,
    tuner_table: str | None,
    wait: bool,
) -> None:
    """Run one collective over a size sweep on NODES and print the nccl-tests-style table.

    \b
    Example:
      topo-tune admin bench run --collective all_reduce --nodes gpu-a1,gpu-a2 -b 8 -e 1G -f 4
      topo-tune admin bench run --nodes gpu-a1,gpu-a2 -b 1M -e 1G --tuner-table candidate.conf
    """
    env: dict[str, str] = {}
    for pair in env_pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--env")
        env[key] = value
    request = BenchmarkRequest(
        collective=Collective(collective),
        nodes=tuple(n.strip() for n in nodes.split(",") if n.strip()),
        sizes=SizeRange(min_bytes, max_bytes, step_factor),
        dtype=dtype,
        iters=iters,
        warmup_iters=warmup_iters,
        ranks_per_node=ranks_per_node,
        env=env,
        deadline_s=deadline,
        both_placements=in_place,
        cuda_graph=cuda_graph,
        tuner_table=tuner_table or "",
    )
    job = client.start_benchmark(request)
    if wait and job.status is JobStatus.RUNNING:
        emit_line(f"# job {job.job_id} running on {len(job.nodes)} nodes ...", err=True)
        job = client.watch_benchmark(
            job.job_id,
            progress_lines("nodes reported", lambda found: found.status is JobStatus.RUNNING),
        )
    _print_job(job, fmt)
    if job.status not in (JobStatus.RUNNING, JobStatus.SUCCEEDED):
        raise ControllerError(job.message or f"benchmark job {job.job_id} {job.status.value}")


@bench.command()
@click.argument("job_id", metavar="ID")
@connected
def show(client: AdminClient, fmt: str, job_id: str) -> None:
    """Show a benchmark job and its nccl-tests-style table."""
    _print_job(client.get_benchmark(JobId(job_id)), fmt)


@bench.command("list")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@connected
def list_jobs(client: AdminClient, fmt: str, limit: int) -> None:
    """List recent benchmark jobs, newest first."""
    jobs = client.list_benchmarks(limit=limit)
    if fmt != "table":
        emit_data([benchmark_job_data(j) for j in jobs], fmt)
        return
    rows = [
        (
            j.job_id,
            j.collective,
            j.status.value + (" (simulated)" if j.simulated else ""),
            str(j.world_size),
            ",".join(j.nodes),
        )
        for j in jobs
    ]
    emit_table(f"{len(jobs)} benchmark jobs", ("ID", "COLLECTIVE", "STATUS", "RANKS", "NODES"), rows)
