"""Studies the controller runs itself (``admin study start|status|trials|best|cancel``).

A study is the same pass as ``topo-tune init``, over nodes the controller already knows, run in a worker thread.
The pass is given to the controller by its composition root (``StudyPass``: the command that serves it), so the
controller never imports the tuning pass. It reaches the controller's services in-process through
``api/in_process.py``'s port (the same calls the admin API offers), so benchmark jobs, probes and config versions go
through exactly the code the admin API uses; a controller built without a pass answers ``study start`` with a
refusal naming what is missing. Trials live in Optuna's tables in the controller's database;
the study row says where it stands, and `changes` wakes its watchers at each step (a trial finished, a phase
begun, the end committed). A cancelled study — or one a controller restart interrupted — resumes
where it stopped when it is started again with the same id: no trial is lost or counted twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import optuna
import sqlalchemy as sa
from sqlalchemy.orm import Session

from topo_tune.config.checks import naming_fields, validated
from topo_tune.config.cluster import (
    API_VERSION,
    ClusterConfig,
    LearningConfig,
    Metadata,
    NodeConfig,
    RackConfig,
    SearchConfig,
    SpineConfig,
    WorkloadConfig,
)
from topo_tune.controller import names as check
from topo_tune.controller.changes import Changes
from topo_tune.controller.db.database import Database, first_line, is_disk_full
from topo_tune.controller.db.left_running import end_left_running
from topo_tune.controller.db.models import StudyRow
from topo_tune.controller.nodes import NodeRegistry
from topo_tune.errors import (
    AlreadyExists,
    ConfigError,
    ConflictError,
    NotFoundError,
    StorageError,
    StudyCancelled,
    TopoTuneError,
    ValidationError,
)
from topo_tune.ids import NodeName, StudyId
from topo_tune.node_record import NodeState
from topo_tune.study_record import Study, StudyRequest, StudyStatus, StudyTrial, StudyTrials
from topo_tune.tuner.objective import workload_profile
from topo_tune.tuner.space import check_site_fixed
from topo_tune.tuner.study import A_FAILURE, A_REASON, StudyProgress

logger = logging.getLogger(__name__)


def _said(error: BaseException) -> str:
    """The error's class and first line; for Optuna's storage error, those of what it wraps (its own text
    blames "invalid data in the commit" whatever went wrong)."""
    if isinstance(error, optuna.exceptions.StorageInternalError) and error.__cause__ is not None:
        error = error.__cause__
    return f"{error.__class__.__name__}: {first_line(error)[:200]}"


_OPTUNA_STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "RUNNING": "running", "WAITING": "waiting"}

Port = TypeVar("Port")
Port_contra = TypeVar("Port_contra", contravariant=True)


@dataclass(frozen=True)
class StudyEnd:
    """What a finished pass leaves in its study's row."""

    promoted: bool
    """A winner was proven and written as a config version (else: keep NCCL's defaults)."""
    config_version: str
    optuna_name: str
    summary: str
    """The trial count and the verdict, in a few lines."""


class StudyPass(Protocol[Port_contra]):
    """The pass a study runs (``topo-tune init``'s), given the in-process port to the controller's services."""

    def run(
        self,
        cluster: ClusterConfig,
        port: Port_contra,
        *,
        output: Path,
        storage: str,
        on_progress: Callable[[StudyProgress], None],
    ) -> StudyEnd:
        """The whole pass; raises ``StudyCancelled`` when the port's cancel flag stops it."""


@dataclass
class Studies(Generic[Port]):
    db: Database
    registry: NodeRegistry
    wall_clock: Callable[[], datetime]
    output_root: Path
    open_port: Callable[[asyncio.AbstractEventLoop, threading.Event], Port]
    """The admin calls a study's pass makes, answered in-process (``api/in_process.py``); given the loop the
    services run on and the study's cancel flag."""
    study_pass: StudyPass[Port] | None
    """None: a controller that runs no studies (built by a test); ``study start`` is refused."""
    rack_of: Mapping[str, str] = field(default_factory=dict)
    spine: tuple[float | None, float | None] = (None, None)
    learning: LearningConfig = field(default_factory=LearningConfig)
    """cluster.yaml's ``learning`` (the controller's): with it on, the version a study writes carries the
    challengers its proof admits, as ``init``'s does."""
    changes: Changes = field(default_factory=Changes)
    outage_wait_s: float = 120.0
    """How long a study waits for its database to come back after its Optuna storage failed, then resumes."""
    _running: dict[str, tuple[threading.Thread, threading.Event]] = field(default_factory=dict, init=False)
    _progress: dict[str, StudyProgress] = field(default_factory=dict, init=False)
    _unrecorded: dict[str, tuple[StudyStatus, str, datetime]] = field(default_factory=dict, init=False)
    """Studies whose end this controller could not store (the database's disk full or away): their row still
    says running, so the status, message and time of the end are answered from here until a start with the
    id writes the row again (a restart marks such rows cancelled, as any left running)."""

    async def recover(self) -> int:
        """At start-up: studies a previous controller process was running are marked cancelled."""
        return await end_left_running(
            self.db,
            StudyRow,
            status="cancelled",
            message="the controller restarted during the study; start it again with this id to resume",
            at=self.wall_clock(),
        )

    async def start(self, request: StudyRequest) -> Study:
        study_id = request.study_id or "st-" + uuid.uuid4().hex[:12]
        check.study_id(study_id)
        if study_id in self._running:
            return await self.get(study_id)
        existing = await self.db.run(lambda session: session.get(StudyRow, study_id))
        if existing is not None and existing.status == "succeeded":
            return await self.get(study_id)
        if existing is not None and StudyRequest.from_json(existing.request) != request:
            raise AlreadyExists(f"study {study_id} exists with other settings; use another id")
        cluster = await self._cluster(study_id, request)
        nodes = [n.name for rack in cluster.racks for n in rack.nodes]
        study_pass = self.study_pass
        if study_pass is None:  # after the request's own checks, so a refusal still names the field
            raise ConflictError("this controller was built without the tuning pass, so it runs no studies")
        now = self.wall_clock()

        def write(session: Session) -> None:
            row = session.get(StudyRow, study_id)
            if row is None:
                session.add(
                    StudyRow(
                        id=study_id,
                        status="running",
                        message="",
                        request=request.to_json(),
                        nodes=nodes,
                        created_at=now,
                        simulated=cluster.backend.simulated,
                    )
                )
            else:
                row.status, row.message, row.finished_at = "running", "resumed", None

        await self.db.run(write)  # persist, then start the thread
        self._unrecorded.pop(study_id, None)
        self.changes.changed(study_id)
        cancelled = threading.Event()
        loop = asyncio.get_running_loop()
        storage = self.db.url.render_as_string(hide_password=False)
        output = self.output_root / study_id
        run = functools.partial(
            study_pass.run, cluster, self.open_port(loop, cancelled), output=output, storage=storage
        )
        thread = threading.Thread(
            target=self._run_study, args=(study_id, run, loop), name=f"study-{study_id}", daemon=True
        )
        self._running[study_id] = (thread, cancelled)
        thread.start()
        logger.info("study started", extra={"study": study_id, "nodes": len(nodes)})
        return await self.get(study_id)

    async def _cluster(self, study_id: str, request: StudyRequest) -> ClusterConfig:
        views = [v for v in await self.registry.list() if v.state is NodeState.READY and not v.drained]
        known = {v.name: v for v in await self.registry.list()}
        names: list[NodeName] = []
        for i, raw in enumerate(request.nodes):
            name = check.node_name(raw, f"nodes[{i}]")
            if name not in known:
                raise NotFoundError(f"no node named {name!r}")
            names.append(name)
        names = names or [v.name for v in views]
        if len(names) < 1:
            raise ValidationError("nodes", "no ready node to tune")
        backends = {known[n].backend for n in names}
        if len(backends) != 1:
            raise ValidationError("nodes", f"the nodes run different backends ({', '.join(sorted(backends))})")
        racks: dict[str, list[NodeConfig]] = {}
        with naming_fields(error=ValidationError):
            for name in names:
                rack = self.rack_of.get(name) or known[name].rack or "default"
                racks.setdefault(rack, []).append(NodeConfig(name=name))
        # 0 or empty on the wire leaves search's own default; cuda_graph unset, the backend's (graphs on nccl).
        numbers = ("budget", "seed", "min_bytes", "max_bytes", "step_factor", "finalists", "proof_pairs")
        given: dict[str, object] = {name: getattr(request, name) for name in numbers if getattr(request, name)}
        if request.sampler:
            given["sampler"] = request.sampler
        if request.knobs:
            given["knobs"] = list(request.knobs)
        if request.cuda_graph is not None:
            given["cuda_graph"] = request.cuda_graph
        if request.no_tuner_table:
            given["tuner_table"] = False
        search = validated(SearchConfig, given, where="search", error=ValidationError)
        with naming_fields(error=ValidationError):
            cluster = ClusterConfig(
                api_version=API_VERSION,
                metadata=Metadata(name=study_id),
                backend=backends.pop(),
                racks=[RackConfig(name=rack, nodes=members) for rack, members in racks.items()],
                spine=None if self.spine[0] is None else SpineConfig(oversubscription=self.spine[0]),
                workload=WorkloadConfig(collectives=dict(request.collectives))
                if request.collectives
                else WorkloadConfig(),
                search=search,
                site_fixed=dict(request.site_fixed),
                learning=self.learning,
            )
        try:  # what the pass would refuse once the study runs, refused now
            workload_profile(cluster.workload)
            check_site_fixed(cluster.site_fixed)
        except ConfigError as error:
            raise ValidationError(error.field, error.reason) from None
        return cluster

    def _run_study(self, study_id: str, run: Callable[..., StudyEnd], loop: asyncio.AbstractEventLoop) -> None:
        """``run`` (the pass, given ``on_progress``) in this worker thread, again after a database outage."""

        def changed() -> None:  # from this worker thread: the wake-ups live on the services' loop
            with contextlib.suppress(RuntimeError):  # the loop is closed: the controller stopped, no one waits
                loop.call_soon_threadsafe(self.changes.changed, study_id)

        def progressed(update: StudyProgress) -> None:
            self._progress[study_id] = update
            changed()

        status, message, result, version, name = "failed", "", "", "", ""
        cancelled = self._running[study_id][1]
        while True:
            try:
                end = run(on_progress=progressed)
                status = "succeeded"
                result = "promoted" if end.promoted else "keep NCCL's defaults"
                version, name, message = end.config_version, end.optuna_name, end.summary
            except StudyCancelled:
                status, message = "cancelled", "cancelled by an admin; start it again with this id to resume"
            except (optuna.exceptions.StorageInternalError, sa.exc.OperationalError, StorageError) as error:
                if self._resumes_after_outage(study_id, error, cancelled):
                    continue  # from what was committed, as a start with this id would
                message = self._stopped_by_database(error, cancelled)
                status = "cancelled" if cancelled.is_set() else status
                logger.warning("study stopped: %s", message, extra={"study": study_id})
            except TopoTuneError as error:
                message = str(error)
            except Exception as error:
                logger.exception("study failed", extra={"study": study_id})
                message = f"{error.__class__.__name__}: {error}"
            break
        now = self.wall_clock()

        def finish(session: Session) -> None:
            row = session.get(StudyRow, study_id)
            if row is not None:
                row.status, row.message, row.finished_at = status, message[:4000], now
                row.result, row.config_version = result, version
                row.optuna_name = name or row.optuna_name

        try:
            self.db.transact(finish)
        except StorageError as error:  # its disk full, or away past the retries: the row stays "running"
            self._keep_unstored(study_id, (StudyStatus(status), message, now), error=error)
        finally:
            self._running.pop(study_id, None)
            changed()
        logger.info("study finished: %s", status, extra={"study": study_id})

    def _keep_unstored(self, study_id: str, end: tuple[StudyStatus, str, datetime], *, error: StorageError) -> None:
        """Answer the end the database refused from here (``_unrecorded``), saying it is not stored."""
        status, message, at = end
        logger.warning("could not record the study's end (%s): %s", status, error, extra={"study": study_id})
        said = f"{message}; the controller could not store this end ({first_line(error)[:200]})"
        self._unrecorded[study_id] = (status, said, at)

    def _resumes_after_outage(self, study_id: str, error: BaseException, cancelled: threading.Event) -> bool:
        """Optuna's storage does not retry: when the database went away under it, wait for the database
        (up to ``outage_wait_s``) and say whether the study goes on. A full disk is not waited for."""
        if is_disk_full(error) or cancelled.is_set():
            return False
        logger.warning(
            "the database became unavailable mid-study (%s); waiting up to %.0f s for it, then resuming",
            _said(error),
            self.outage_wait_s,
            extra={"study": study_id},
        )
        if not self.db.wait_until_reachable(for_s=self.outage_wait_s, stop=cancelled):
            return False
        logger.info("the database is back: the study resumes from its stored trials", extra={"study": study_id})
        return True

    def _stopped_by_database(self, error: BaseException, cancelled: threading.Event) -> str:
        said = _said(error)
        if is_disk_full(error):
            return (
                f"the disk under the database filled up mid-study ({said}); its trials are kept: free space, then "
                "start it again with this id to resume"
            )
        if cancelled.is_set():
            return f"cancelled while the database was unavailable ({said}); start it again with this id to resume"
        return (
            f"the database became unavailable mid-study ({said}) and did not come back within "
            f"{self.outage_wait_s:.0f} s; its trials are kept: start it again with this id to resume"
        )

    async def cancel(self, study_id: str) -> Study:
        running = self._running.get(study_id)
        if running is None:
            info = await self.get(study_id)
            if info.status is StudyStatus.RUNNING:
                raise ConflictError(f"study {study_id} is not running in this controller")
            return info
        running[1].set()
        await asyncio.to_thread(running[0].join, 600)
        return await self.get(study_id)

    async def get(self, study_id: str) -> Study:
        row = await self.db.read(lambda session: session.get(StudyRow, study_id))
        if row is None:
            raise NotFoundError(f"no study with id {study_id!r}")
        return self._info(row)

    def _info(self, row: StudyRow) -> Study:
        progress = self._progress.get(row.id)
        status, message, finished_at = StudyStatus(row.status), row.message, row.finished_at
        if status is StudyStatus.RUNNING and row.id in self._unrecorded:
            status, message, finished_at = self._unrecorded[row.id]
        return Study(
            study_id=StudyId(row.id),
            status=status,
            message=message,
            nodes=tuple(row.nodes),
            simulated=row.simulated,
            created_at=row.created_at,
            finished_at=finished_at,
            config_version=row.config_version,
            result=row.result,
            phase=progress.phase if progress is not None else "",
            done=progress.done if progress is not None else 0,
            total=progress.total if progress is not None else 0,
            best_value=progress.best_value if progress is not None else None,
        )

    def watch(self, study_id: str) -> AsyncIterator[Study]:
        """The study now and at each change (a trial finished, a phase begun), ending with the ended study."""
        return self.changes.follow(study_id, lambda: self.get(study_id), lambda s: s.status is not StudyStatus.RUNNING)

    async def list(self, *, limit: int = 50) -> list[Study]:
        def read(session: Session) -> list[StudyRow]:
            return list(session.scalars(sa.select(StudyRow).order_by(StudyRow.created_at.desc()).limit(limit)))

        return [self._info(row) for row in await self.db.read(read)]

    async def trials(self, study_id: str) -> StudyTrials:
        await self.get(study_id)
        prefix = f"init/{study_id}/"
        storage = self.db.url.render_as_string(hide_password=False)

        def read() -> StudyTrials:
            if not _optuna_storage_ready(self.db.engine):
                return StudyTrials(StudyId(study_id))
            names = [s.study_name for s in optuna.get_all_study_summaries(storage) if s.study_name.startswith(prefix)]
            if not names:
                return StudyTrials(StudyId(study_id))
            study = optuna.load_study(study_name=names[-1], storage=storage)
            best: tuple[float, int] | None = None
            trials = []
            for trial in study.get_trials(deepcopy=False):
                state = _OPTUNA_STATES.get(trial.state.name, str(trial.user_attrs.get(A_FAILURE, "failed")))
                value = trial.value if trial.value is not None and state == "complete" else None
                trials.append(
                    StudyTrial(
                        number=trial.number,
                        state=state,
                        reason=str(trial.user_attrs.get(A_REASON) or ""),
                        env={k: str(v) for k, v in trial.params.items()},
                        value=value,
                    )
                )
                if value is not None and (best is None or value > best[0]):
                    best = (value, trial.number)
            return StudyTrials(StudyId(study_id), tuple(trials), best[1] if best is not None else None)

        return await asyncio.to_thread(read)


def _optuna_storage_ready(engine: sa.Engine) -> bool:
    """Whether Optuna has made its tables and stamped their version, the last step of opening its storage.

    Opening the storage creates the tables and stamps the version when they are missing, so a reader that
    opened it while the study itself was doing so raced it: the study lost with an IntegrityError on
    ``alembic_version``. Readers leave the creation to the study.
    """
    if not sa.inspect(engine).has_table("alembic_version"):
        return False
    with engine.connect() as connection:
        return bool(connection.execute(sa.text("SELECT COUNT(*) FROM alembic_version")).scalar_one())
