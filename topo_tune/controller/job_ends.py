"""When a running benchmark job cannot finish, and how it is ended on the nodes still running it.

A job cannot finish once one of its nodes reported its part ``failed`` or ``rejected`` (a rank failed, the
node refused the job): the other ranks would only wait for it at the rendezvous, or collect figures no
summary can use. Nor can it once a node that has not reported is ``lost``: the ranks there are gone or out
of reach. Both end the job at once, ``failed``, naming the node (and, from its ranks' statuses, the rank),
instead of at its deadline. A part ``timed_out`` is left to that deadline: every node has the same one, as
an absolute time, so the others time out with it and the job ends ``timed_out`` naming the ranks that hung.

The nodes whose part is still open are then sent a ``CancelJob``: a command like any other, stored before it
is sent (in the transaction that ends the job), re-sent until its result arrives, and run at most once by
each agent's journal. Its id is derived from the job's, so ending the job twice stores nothing new. The
agent kills the job's workers with their process groups, answers once they are reaped, and refuses the job's
command should it arrive later; a lost node gets its cancel when it comes back. Until a node has answered its
cancel it counts as busy with the job: a new job waits a little for that (``JobSettings.cancel_wait_s``).

Non-goals: the job's bookkeeping (``jobs.py``), delivery (``sessions.py``), killing workers (the agent).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from topo_tune.v1 import agent_pb2

__all__ = ["OpenPart", "cancel_command", "cancel_command_id", "why_it_cannot_finish"]

_MAX_COMMAND_ID = 64
_ENDS_THE_JOB = frozenset({agent_pb2.COMMAND_STATUS_FAILED, agent_pb2.COMMAND_STATUS_REJECTED})


@dataclass(frozen=True)
class OpenPart:
    """One node's part of a job: its command's status and, once final, its result."""

    node_name: str
    final: bool
    result: agent_pb2.CommandResult | None


def why_it_cannot_finish(parts: Sequence[OpenPart], lost: Collection[str]) -> str:
    """Why the job must end now ("" while it can still finish): the first failed node, else the lost ones."""
    for part in parts:
        if part.final and part.result is not None and part.result.status in _ENDS_THE_JOB:
            return f"node {part.node_name} {_failure(part.result)}"
    gone = sorted(p.node_name for p in parts if not p.final and p.node_name in lost)
    if gone:
        return f"node{'s' if len(gone) > 1 else ''} {', '.join(gone)} lost (no heartbeat) while the job ran"
    return ""


def _failure(result: agent_pb2.CommandResult) -> str:
    """What went wrong on a node, naming its ranks that failed on their own."""
    status = agent_pb2.CommandStatus.Name(result.status).removeprefix("COMMAND_STATUS_").lower()
    failed = [
        s
        for s in result.node_benchmark.rank_status
        if s.outcome in (agent_pb2.RANK_OUTCOME_FAILED, agent_pb2.RANK_OUTCOME_HUNG)
        and not s.message.startswith("killed because another local rank failed")
    ]
    if failed:
        return f"rank {failed[0].rank} {status}: {failed[0].message}"
    return f"{status}: {result.message}"


def cancel_command_id(job_id: str, node_index: int) -> str:
    """The cancel command of a job on its ``node_index``-th node: the same id each time it is asked for."""
    wanted = f"{job_id}-cancel-{node_index}"
    if len(wanted) <= _MAX_COMMAND_ID:
        return wanted
    return f"cancel-{hashlib.sha256(job_id.encode()).hexdigest()[:40]}-{node_index}"


def cancel_command(job_id: str, reason: str) -> agent_pb2.Command:
    """The ``CancelJob`` of a job (an agent runs it whenever it arrives, past the job's deadline too)."""
    return agent_pb2.Command(cancel_job=agent_pb2.CancelJob(job_id=job_id, reason=reason))
