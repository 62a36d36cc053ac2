"""What a version's learning jobs showed, and a challenger proposed as a new version (``docs/learning.md``).

``evidence`` reads the records stored for the version's jobs (``job_timings``) and compares its challengers
with its chosen table with the proof's default statistics (``learning.version_evidence``). ``propose`` turns a
challenger the evidence shows better where it applies and never worse into a new config version: the old
one's files with the challenger's table as its chosen ``nccl_tuner.conf`` and no challenger of its own. It is
stored only: a person rolls it out (``admin rollout create``), through the rollout's gates and approval
policy, and no running job's configuration changes (jobs keep their pins).

Non-goals: shipping or storing records (``job_timings``), the statistics (``learning``).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass

from topo_tune.config.cluster import PROOF_ALPHA, PROOF_MAX_LOSS, PROOF_MIN_EFFECT
from topo_tune.controller.config_versions import ConfigVersions, StoredVersion
from topo_tune.controller.job_timings import JobTimings
from topo_tune.errors import ConflictError, ValidationError
from topo_tune.ids import ConfigVersionId
from topo_tune.learning.version_evidence import VersionEvidence, version_evidence
from topo_tune.plugin.timing_record import TimingRecord
from topo_tune.versions.version import (
    CHALLENGER_TABLES,
    TUNER_TABLE,
    ConfigVersion,
    challenger_count,
    challenger_table,
)

_KEPT_PROVENANCE = ("nccl_version", "topology_fingerprint", "space_fingerprint", "simulated")
"""What a proposed version keeps of its parent's provenance: what its tables were measured on."""


@dataclass
class Learning:
    versions: ConfigVersions
    timings: JobTimings

    async def evidence(self, version: ConfigVersionId) -> VersionEvidence:
        stored = await self.versions.get(version)  # validates the id; NotFoundError names it
        files = dict(stored.files)
        tables = [
            files.get(TUNER_TABLE, ""),
            *(files[challenger_table(i)] for i in range(1, challenger_count(files) + 1)),
        ]
        by_job: dict[str, list[TimingRecord]] = defaultdict(list)
        for timing in await self.timings.of_version(version):
            by_job[timing.job_id].append(timing.record)
        found = version_evidence(
            version, by_job, tables=tables, alpha=PROOF_ALPHA, min_effect=PROOF_MIN_EFFECT, max_loss=PROOF_MAX_LOSS
        )
        why = stored.learning_stopped_why
        return dataclasses.replace(found, learning_stopped=stored.learning_stopped, learning_stopped_why=why)

    async def propose(self, version: ConfigVersionId, arm: int, *, actor: str) -> StoredVersion:
        """Store ``version`` with challenger ``arm``'s table as its chosen one; refused unless the evidence
        shows it proposable."""
        stored = await self.versions.get(version)
        if not 1 <= arm <= challenger_count(stored.files):
            raise ValidationError("arm", f"{version} carries {challenger_count(stored.files)} challengers, not {arm}")
        evidence = await self.evidence(version)
        if arm not in evidence.proposable:
            raise ConflictError(
                f"challenger {arm} of {version} is not shown faster where its table applies and non-inferior in "
                "every class there (see admin learning evidence)"
            )
        files = {n: text for n, text in stored.files.items() if n not in CHALLENGER_TABLES}
        files[TUNER_TABLE] = stored.files[challenger_table(arm)]
        jobs = evidence.jobs_by_arm
        provenance = {k: stored.provenance[k] for k in _KEPT_PROVENANCE if k in stored.provenance}
        provenance |= {
            "source": "learning",
            "learned_from": version,
            "learned_arm": str(arm),
            "learned_jobs": f"{jobs.get(0, 0)} on the chosen table, {jobs.get(arm, 0)} on challenger {arm}",
            "proposed_by": actor,
        }
        return await self.versions.store(ConfigVersion(files, provenance))
