"""The leader fence in the database: a leader's transaction commits only while its epoch is the newest.

Leader election on a Lease cannot stop a paused leader (SIGSTOP, a long GC pause, a frozen VM) that checked
``LeaderElector.holds(term)`` just before the pause from committing after a successor took over. So the
database enforces it too, with a fencing token:

- One row (``leader_epoch``, migration 0008) holds the newest leader's **epoch**: the Lease's
  ``leaseTransitions`` when its term began, which every takeover raises (cluster-wide monotonic).
- A new leader **claims** its epoch before any leader work: ``UPDATE … SET epoch = :e WHERE epoch <= :e``
  (equal: the same holder's tenure of the Lease, resumed after its in-process term lapsed). When the row holds
  a higher epoch already, the term is stale (a successor has claimed since) and the claim raises
  ``FencedError``; the controller ends the term.
- Every transaction of a fenced ``Database`` runs the **guard** just before it commits (after flushing its
  writes): ``SELECT epoch … FOR SHARE``. A different epoch aborts the transaction with ``FencedError`` (both
  epochs named) and nothing of it is written. On PostgreSQL the share lock makes a successor's claim
  (an UPDATE of that row) wait until the in-flight commit is done, so a commit is either before the claim
  (the successor then loads it, level-triggered) or refused. The guard also sets the transaction's
  ``idle_in_transaction_session_timeout``: a leader frozen between guard and commit is disconnected by the
  server after that long, which releases the lock instead of blocking the successor for ever.
  SQLite has one writer at a time: the guard runs after the flush, so a writing transaction holds the write
  lock from before the guard until its commit, and a claim (a write) cannot slip in between.

Which writes are fenced: all of them, once the controller has claimed an epoch. With leader election only
the leader serves agents and admins and runs the periodic jobs (studies, rollouts, drift checks, retention,
benchmark jobs, the node registry), so every write of the controller process is leader work; a standby that
never led writes nothing. Without leader election (one replica, the default) no epoch is claimed and no
guard runs: nothing changes, not even one extra statement.

Non-goals: Optuna's own tables (trials of a running study, written through Optuna's storage, not through
``Database``) are not fenced; a stale leader's trial rows are harmless because the study's state in
``tuning_studies`` is. A Lease deleted and recreated restarts ``leaseTransitions`` at 0 below the stored
epoch: the elector then takes the Lease over above the stored epoch (``StaleTermError``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from topo_tune.controller.db.models import LeaderEpochRow
from topo_tune.errors import FencedError

logger = logging.getLogger(__name__)

ROW_ID = 1


@dataclass(frozen=True)
class Fence:
    """The epoch a fenced ``Database`` writes under."""

    epoch: int
    holder: str
    idle_timeout_s: float = 5.0
    """PostgreSQL: how long a transaction may sit between its guard and its commit (a frozen process)."""


def claim(session: Session, *, epoch: int, holder: str, at: datetime) -> None:
    """Raise the stored epoch to ``epoch`` (never lower it); ``FencedError`` when it is higher already.

    On PostgreSQL the UPDATE waits for the guards of in-flight commits (their share locks) to finish.
    """
    row = LeaderEpochRow
    raised = session.execute(
        sa.update(row)
        .where(row.id == ROW_ID, row.epoch <= epoch)
        .values(epoch=epoch, holder=holder, claimed_at=at)
        .execution_options(synchronize_session=False)
    )
    if raised.rowcount:  # type: ignore[attr-defined]
        return
    current = session.execute(sa.select(row.epoch, row.holder).where(row.id == ROW_ID)).one_or_none()
    if current is None:  # the row was deleted by hand: put it back
        session.add(LeaderEpochRow(id=ROW_ID, epoch=epoch, holder=holder, claimed_at=at))
        return
    raise FencedError(ours=epoch, current=current.epoch, holder=current.holder)


def guard(session: Session, fence: Fence) -> None:
    """The check that precedes every commit of a fenced ``Database``; ``FencedError`` aborts it."""
    row = LeaderEpochRow
    query = sa.select(row.epoch, row.holder).where(row.id == ROW_ID)
    if session.get_bind().dialect.name == "postgresql":
        # One round trip: the share lock, and the bound on how long a frozen leader may keep holding it.
        timeout = sa.func.set_config(
            "idle_in_transaction_session_timeout", f"{max(1, round(fence.idle_timeout_s * 1000))}ms", True
        )
        query = query.add_columns(timeout).with_for_update(read=True)
    current = session.execute(query).one_or_none()
    if current is None or current.epoch != fence.epoch:
        found = -1 if current is None else current.epoch
        raise FencedError(ours=fence.epoch, current=found, holder="" if current is None else current.holder)
