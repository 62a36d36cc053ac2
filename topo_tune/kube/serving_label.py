"""The leader's pod carries a label that the controller Service selects, so every replica can be Ready.

With leader election, only the Lease holder serves agents and admins. Marking standbys unready would keep
the Service on the leader, but it also leaves the Deployment at ``READY 1/2`` for good, so ``helm install
--wait`` and ``kubectl rollout status`` never finish and a PodDisruptionBudget cannot be set. Instead every
replica is Ready when its process is, and the controller labels its own pod ``topo-tune.io/leader=true``
while it leads; the Service selects that label.

The label is level-triggered: every round compares "leading now" with what this process last wrote and
patches only on a difference. A replica that starts (or restarts in the same pod after a crash, label still
on) first removes it, and a replica that stops removes it before it lets go of the Lease. A failed patch is
retried next round. Meanwhile a replica that is not the leader refuses calls with ``UNAVAILABLE``, which
clients retry, so a stale label costs a retry, never a wrong answer.

Non-goal: routing decisions of its own. The Service and the leader-only interceptor do that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from topo_tune.errors import KubernetesError

logger = logging.getLogger(__name__)

LEADER_LABEL = "topo-tune.io/leader"
"""Set to ``"true"`` on the leading controller's pod; the chart's Service selects it."""

_UNKNOWN = object()


class PodLabelApi(Protocol):
    """``KubeApi.label_pod`` (blocking)."""

    def label_pod(self, namespace: str, name: str, *, key: str, value: str | None) -> None: ...


class ServingLabel:
    """Keeps ``LEADER_LABEL`` on this controller's own pod exactly while ``leading()`` is True."""

    def __init__(self, *, api: PodLabelApi, namespace: str, pod_name: str, leading: Callable[[], bool]) -> None:
        self._api = api
        self._namespace = namespace
        self._pod = pod_name
        self._leading = leading
        self._written: object = _UNKNOWN
        self._last_error = ""

    async def reconcile(self) -> None:
        """One round: write the label if it may differ from "leading now"; never raises."""
        wanted = "true" if self._leading() else None
        if self._written == wanted:
            return
        try:
            await asyncio.to_thread(self._api.label_pod, self._namespace, self._pod, key=LEADER_LABEL, value=wanted)
        except KubernetesError as error:
            self._written = _UNKNOWN  # retried next round
            if str(error) != self._last_error:
                logger.warning("cannot %s the leader label: %s", "set" if wanted else "remove", error)
                self._last_error = str(error)
            return
        self._written = wanted
        self._last_error = ""
        logger.info("leader label %s on pod %s/%s", "set" if wanted else "removed", self._namespace, self._pod)

    async def run(self, stop: asyncio.Event, period_s: float) -> None:
        """Reconcile every ``period_s`` until ``stop`` is set."""
        while not stop.is_set():
            await self.reconcile()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period_s)
