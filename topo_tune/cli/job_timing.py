"""A learning job's timing records, shipped by ``exec`` once the job's command ended (``docs/learning.md``).

The plugin's profiler writes one record per communicator and rank into the job's workload directory at
finalize (``plugin.timing_record``). ``exec`` on each node runs the command as its child, then sends the
records its node's ranks wrote to the controller with the job's own credential, in calls of bounded size,
and removes a directory it made itself. Shipping never changes how the job ends: a failure is one line on
stderr, and the job's exit status stands.

Non-goals: checking the records (the controller parses them whole and refuses a bad one, naming it),
comparing arms (``admin learning evidence``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NoReturn

from topo_tune.cli.child_process import end_as, run_child
from topo_tune.cli.output import emit_line
from topo_tune.client.admin import AdminClient
from topo_tune.errors import TopoTuneError
from topo_tune.plugin.timing_record import MAX_CALL_BYTES, MAX_RECORDS_PER_CALL, MAX_TIMING_BYTES, TIMING_FILES

MAX_FILES = 16 * MAX_RECORDS_PER_CALL
"""Records one node ships for one job at most (its ranks times their communicators); the rest are left."""


def _warn(text: str) -> None:
    emit_line(f"topo-tune: warning: {text}", err=True)


def read_records(directory: Path) -> list[str]:
    """The record files' texts in ``directory``, oldest name first; oversized files and links are skipped."""
    texts = []
    for path in sorted(directory.glob(TIMING_FILES))[:MAX_FILES]:
        if path.is_symlink() or not path.is_file():
            continue
        if path.stat().st_size > MAX_TIMING_BYTES:
            _warn(f"{path.name}: larger than a timing record may be ({MAX_TIMING_BYTES} bytes); not shipped")
            continue
        texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return texts


def batches(texts: list[str]) -> list[list[str]]:
    """``texts`` in calls the controller accepts: at most ``MAX_RECORDS_PER_CALL`` and ``MAX_CALL_BYTES`` each."""
    out: list[list[str]] = [[]]
    size = 0
    for text in texts:
        length = len(text.encode())
        if out[-1] and (len(out[-1]) == MAX_RECORDS_PER_CALL or size + length > MAX_CALL_BYTES):
            out.append([])
            size = 0
        out[-1].append(text)
        size += length
    return [batch for batch in out if batch]


def ship_records(client: AdminClient, *, job_id: str, node: str, directory: Path) -> None:
    """Send the records in ``directory`` for ``job_id``; one line on stderr says what happened."""
    texts = read_records(directory)
    if not texts:
        _warn(f"no timing records in {directory} (did NCCL load the profiler? NCCL 2.28 or later is needed)")
        return
    try:
        stored = sum(client.record_job_timing(job_id, node, batch) for batch in batches(texts))
    except TopoTuneError as error:
        _warn(f"the job's {len(texts)} timing records were not shipped: {error}")
        return
    emit_line(f"topo-tune: shipped {len(texts)} timing records of job {job_id} ({stored} new)", err=True)


def run_and_ship(
    argv: list[str], env: dict[str, str], *, client: AdminClient, job_id: str, node: str, directory: Path, own: bool
) -> NoReturn:
    """Run the job's command as a child, ship its records, remove ``directory`` when ``own`` (``exec`` made it),
    and end as the command ended."""
    try:
        status = run_child(argv, env)
        ship_records(client, job_id=job_id, node=node, directory=directory)
    finally:
        if own:
            shutil.rmtree(directory, ignore_errors=True)
    end_as(status)
