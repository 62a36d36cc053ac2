"""A Kubernetes job's nodes from the API: the pods of the Job or JobSet whose uid a job id is, once all are scheduled.

A pod of a training job can ask ``topo-tune env``/``exec`` for its rank with no node list and no kubectl: the
controller (in Kubernetes mode; its ClusterRole lists pods and reads Jobs and JobSets) finds the pods by the
labels Kubernetes puts on them (``batch.kubernetes.io/controller-uid`` for a Job, ``jobset.sigs.k8s.io/jobset-uid``
for a JobSet), reads the Job or JobSet for how many pods run together, and waits, bounded, until that many are
bound to nodes. The answer is the set of those nodes; the order is the job config's business.

Non-goals: other workload kinds (MPIJob, PyTorchJob: pass ``--nodes``), pods that share a node (one per node).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from topo_tune.errors import ConflictError, NotFoundError
from topo_tune.kube.idleness import FINISHED_PHASES
from topo_tune.kube.objects import PodInfo, WorkloadInfo

if TYPE_CHECKING:
    from topo_tune.kube.api import KubeApi

logger = logging.getLogger(__name__)

JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
DEFAULT_WAIT_S = 120.0
MAX_WAIT_S = 600.0
POLL_S = 1.0
"""How often the pods are listed again while some are not yet scheduled (one list call each time)."""


class KubeJobNodes:
    """``await lookup(uid, wait_s=...)``: the nodes of the Job or JobSet with that uid, sorted."""

    def __init__(self, api: KubeApi, *, poll_s: float = POLL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.poll_s = poll_s
        self.clock = clock

    async def __call__(self, uid: str, *, wait_s: float = DEFAULT_WAIT_S) -> list[str]:
        """Raises ``NotFoundError`` when no Job or JobSet pod carries ``uid``, ``ConflictError`` when not all its
        pods are scheduled within ``wait_s`` (the message says how many are, and names a waiting one)."""
        deadline = self.clock() + min(max(wait_s, 0.0), MAX_WAIT_S)
        workload: WorkloadInfo | None = None
        while True:
            pods, workload = await asyncio.to_thread(self._read, uid, workload)
            if workload is not None:
                running = [p for p in pods if p.phase not in FINISHED_PHASES]
                nodes = sorted({p.node_name for p in running if p.node_name})
                if len([p for p in running if p.node_name]) >= workload.pods:
                    return nodes
            if self.clock() >= deadline:
                raise self._not_ready(uid, workload, pods, wait_s)
            await asyncio.sleep(self.poll_s)

    def _read(self, uid: str, workload: WorkloadInfo | None) -> tuple[list[PodInfo], WorkloadInfo | None]:
        for uid_label, name_label, read in (
            (JOB_UID_LABEL, JOB_NAME_LABEL, self.api.read_job),
            (JOBSET_UID_LABEL, JOBSET_NAME_LABEL, self.api.read_jobset),
        ):
            pods = self.api.pods_labelled(f"{uid_label}={uid}")
            if not pods:
                continue
            if workload is None and pods[0].labels.get(name_label):
                workload = read(pods[0].namespace, pods[0].labels[name_label])
                if workload.uid != uid:  # a pod labelled with another object's uid: not this job's
                    raise NotFoundError(f"{workload.kind} {workload.namespace}/{workload.name} has uid {workload.uid}")
            return pods, workload
        return [], workload

    @staticmethod
    def _not_ready(uid: str, workload: WorkloadInfo | None, pods: list[PodInfo], wait_s: float) -> Exception:
        if workload is None:
            return NotFoundError(
                f"job {uid}: no pod of a Job or JobSet with this uid (labels {JOB_UID_LABEL}, {JOBSET_UID_LABEL}) "
                f"after {wait_s:.0f} s: pass the Job's or JobSet's metadata.uid as the job id, or --nodes"
            )
        scheduled = [p for p in pods if p.node_name and p.phase not in FINISHED_PHASES]
        waiting = sorted(p.name for p in pods if not p.node_name)
        return ConflictError(
            f"job {uid} ({workload.kind} {workload.namespace}/{workload.name}): {len(scheduled)} of {workload.pods} "
            f"pods scheduled after {wait_s:.0f} s" + (f" (waiting: {', '.join(waiting[:3])})" if waiting else "")
        )
