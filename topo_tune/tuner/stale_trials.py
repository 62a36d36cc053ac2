"""Stale trials: a running trial whose worker is gone is failed as ``stale`` and enqueued again once.

Purpose: our own heartbeats (``trial_store.Heartbeat``) mark a running trial as alive. A running trial whose
worker is this one (a restarted controller reusing its id) but that this process is not running, or whose
heartbeat is older than ``stale_after_s``, or that nobody labelled within a short grace, is failed as
``stale`` and retried once with the params it was enqueued with.

Non-goals: running trials (``study``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from topo_tune.tuner.trial_store import (
    A_ATTEMPT,
    A_CANDIDATE,
    A_FAILURE,
    A_HEARTBEAT,
    A_REASON,
    A_RETRY_OF,
    A_ROLE,
    A_TABLE,
    A_WORKER,
    has_every_param,
    trial_id,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from topo_tune.tuner.space import SearchSpace

__all__ = ["StaleTrials"]

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 2  # a stale trial is retried once
UNLABELED_GRACE_S = 10.0
"""How long a running trial without a worker label is left alone (labelling takes milliseconds)."""


class StaleTrials:
    """The study's stale-trial reclaim: fails trials whose worker is gone and enqueues each once more."""

    def __init__(
        self,
        space: SearchSpace,
        *,
        worker_id: str,
        stale_after_s: float,
        clock: Callable[[], float],
        runs_here: Callable[[int], bool],
    ) -> None:
        self.space = space
        self.worker_id = worker_id
        self.stale_after_s = stale_after_s
        self.clock = clock
        self.runs_here = runs_here
        """Whether this process is running trial ``number`` now (its heartbeat may lag, it is not stale)."""

    def reclaim(self, study: optuna.Study, storage: optuna.storages.RDBStorage) -> None:
        """Fail running trials whose worker is gone, and enqueue each once more (idempotently)."""
        now = self.clock()
        trials = study.get_trials(deepcopy=False)
        retried = {t.user_attrs.get(A_RETRY_OF) for t in trials}
        for t in trials:
            if t.state != TrialState.RUNNING or self.runs_here(t.number):
                continue
            beat = t.user_attrs.get(A_HEARTBEAT)
            if beat is None:
                beat = t.datetime_start.timestamp() if t.datetime_start is not None else now
            mine = t.user_attrs.get(A_WORKER) == self.worker_id
            # A worker labels its trial right after asking for it; one killed in between leaves a running trial
            # nobody owns, which no heartbeat will ever refresh: reclaim it after a short grace, not stale_after_s.
            unlabeled = A_WORKER not in t.user_attrs
            patience = UNLABELED_GRACE_S if unlabeled else self.stale_after_s
            if not mine and now - float(beat) <= patience:
                continue
            if mine:
                reason = "its worker restarted while it ran"
            elif unlabeled:
                reason = f"its worker stopped before labelling it ({now - float(beat):.0f} s ago)"
            else:
                reason = f"no heartbeat for {now - float(beat):.0f} s (worker {t.user_attrs.get(A_WORKER, 'unknown')})"
            logger.warning("trial %d is stale: %s", t.number, reason)
            stored_id = trial_id(storage, study, t.number)
            storage.set_trial_user_attr(stored_id, A_FAILURE, "stale")
            storage.set_trial_user_attr(stored_id, A_REASON, reason)
            attempt = int(t.user_attrs.get(A_ATTEMPT, 1))
            if attempt < MAX_ATTEMPTS and t.number not in retried:
                attrs = {k: v for k, v in t.user_attrs.items() if k in (A_ROLE, A_CANDIDATE, A_TABLE)}
                attrs.update({A_ATTEMPT: attempt + 1, A_RETRY_OF: t.number})
                study.enqueue_trial(self._retry_params(t), user_attrs=attrs)
            # If it finished meanwhile its result stands; the retry, if any, just measures it again.
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                storage.set_trial_state_values(stored_id, TrialState.FAIL)

    def _retry_params(self, t: FrozenTrial) -> dict[str, Any]:
        """What a stale trial's retry measures: its own params, once every one of them was stored.

        Optuna stores a trial's params one by one as ``ask()`` suggests them, so a worker killed inside ``ask()``
        leaves a subset. An enqueued trial (baseline, candidate, table) is then retried with the params it was
        enqueued with; a sampled one with none fixed, so the sampler draws a whole new configuration.
        """
        if has_every_param(self.space, t.params):
            return dict(t.params)
        fixed = t.system_attrs.get("fixed_params")
        return dict(fixed) if isinstance(fixed, dict) else {}
