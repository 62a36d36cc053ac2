"""One config per job: which config version a job gets, pinned for its whole life, and the environment for it.

NCCL's ranks must agree on every tuned value (a job whose ranks disagree hangs or corrupts data), so the
version is chosen per job, never per node: the rollout's new version only if every node of the job is in a
completed wave, otherwise the previous stable one. The first answer for a job id is pinned: every rank of
the job, and the job asking again after another wave completed, gets the same version. The environment
points ``NCCL_CONF_FILE`` at the pinned version's staged file (``versions/<id>/nccl.conf``), which never
changes while the job runs; for NCCL's defaults it points at ``/dev/null`` so no ``~/.nccl.conf`` leaks in.

A version is settings and order: the pin also holds the job's node order (``tuner/ring/job_order.py`` computes it
from the version and the job's node set), and the environment names this node's rank in it
(:func:`order_environment`). Besides the job's own config (arm ""), a job may ask for an explicitly named
arm (:func:`arm_version`: a version id, "stable" or "defaults"), pinned per (job id, arm) the same way, so
that ``exec --compare`` runs every arm with one version and one order on every node.

Everything here is pure: the rollout state comes in as data (:class:`RolloutView`), pins as a mapping, the
process environment as a mapping. Non-goals: storing pins (the controller does) and running the job (the CLI).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from topo_tune.config.values import NODE_NAME_PATTERN
from topo_tune.errors import ConfigError, ConflictError
from topo_tune.ids import NO_CONFIG_VERSION, NO_ROLLOUT, ConfigVersionId, NodeName, RolloutId
from topo_tune.learning.assignment import ArmIndex
from topo_tune.plugin.job_env import learning_env, plugin_env
from topo_tune.versions.layout import staged_path
from topo_tune.versions.version import NCCL_CONF, TOPO_FILE, TUNER_TABLE, challenger_table, is_version_id

DEFAULTS_FILE = "/dev/null"
"""NCCL_CONF_FILE for a job on NCCL's defaults: an empty file, so ``~/.nccl.conf`` is not read either."""

JOB_ID_VARIABLES = (
    "TOPO_TUNE_JOB_ID",
    "SLURM_JOB_ID",
    "TORCHELASTIC_RUN_ID",
    "PMIX_NAMESPACE",
    "OMPI_MCA_ess_base_jobid",
)
"""Where a job's id comes from, first match wins. On Kubernetes, set TOPO_TUNE_JOB_ID from the Job's uid
(downward API ``metadata.labels['batch.kubernetes.io/controller-uid']``)."""

JOB_INSTANCE_VARIABLES = {
    "SLURM_JOB_ID": "SLURM_JOB_START_TIME",
    "PMIX_NAMESPACE": "OMPI_MCA_orte_precondition_transports",
    "OMPI_MCA_ess_base_jobid": "OMPI_MCA_orte_precondition_transports",
}
"""What tells two runs apart that a launcher gives one id: a pin is made per job id, so a reused id (Open MPI's
PMIx namespace comes from mpirun's host and pid; Slurm's ids start again after its state is reset) would hand
a new job an old job's version and order. Where the launcher exports a per-run value (Slurm's job start time,
where Slurm sets it; Open MPI's per-launch transport key, hashed: it is a key), the id is ``ID+INSTANCE``, the
same for every rank of one run and different for the next."""

SLURM_NODE_LIST = "SLURM_JOB_NODELIST"
"""The allocation's nodes, the same string in every task of a job: what tells apart, on a Slurm without
``SLURM_JOB_START_TIME`` (22.05), two jobs given one id that run on different nodes."""

TORCHRUN_DEFAULT_RUN_ID = "none"
"""torchrun's ``--rdzv-id`` when none is given: every such run would share it, so it names no job."""


@dataclass(frozen=True)
class RolloutView:
    """What job resolution needs to know about the rollout state."""

    stable_version: ConfigVersionId
    """The version every node has (the previous stable one while a rollout runs; "" = NCCL's defaults)."""
    new_version: ConfigVersionId = NO_CONFIG_VERSION
    """The version being rolled out ("" when none is, or while it rolls back)."""
    migrated_nodes: frozenset[NodeName] = frozenset()
    """Nodes in completed waves of that rollout."""
    rollout_id: RolloutId = NO_ROLLOUT


ARM_STABLE = "stable"
ARM_DEFAULTS = "defaults"
ARMS = (ARM_STABLE, ARM_DEFAULTS)
"""The arms a job may name besides a version id; "" is the job's own config (the rollout's rule)."""


@dataclass(frozen=True)
class JobPin:
    job_id: str
    version: ConfigVersionId
    nodes: tuple[str, ...]
    order: tuple[str, ...] = ()
    """The job's node order: node rank i runs on ``order[i]``; empty until the controller computed it."""
    arm: str = ""
    learning_arm: ArmIndex | None = None
    """The table the job runs for its life when it learns (``learning.assignment``; 0: the version's chosen
    one, i: its i-th challenger); None: the job does not learn, and runs the chosen table as before."""


@dataclass(frozen=True)
class LearningPin:
    """What a learning job's pin adds to its environment: its arm, and how often the profiler times a call."""

    arm: ArmIndex
    timing_sample: int


def arm_version(arm: str, nodes: Sequence[str], view: RolloutView) -> ConfigVersionId:
    """The version an arm names: "" the job's own (:func:`choose_version`), "stable" the stable one (even while
    a rollout runs), "defaults" none (NCCL's defaults), or a version id as given."""
    if not arm:
        return choose_version(nodes, view)
    if arm == ARM_STABLE:
        return view.stable_version
    if arm == ARM_DEFAULTS:
        return NO_CONFIG_VERSION
    if is_version_id(arm):
        return arm
    raise ConfigError("arm", f"{arm[:80]!r} is not a config version id (cv- and 16 hex digits), stable or defaults")


def choose_version(nodes: Sequence[str], view: RolloutView) -> ConfigVersionId:
    """The new version only if every node of the job is migrated, else the stable one."""
    if not nodes:
        raise ConfigError("--nodes", "a job needs at least one node")
    if view.new_version and all(node in view.migrated_nodes for node in nodes):
        return view.new_version
    return view.stable_version


def resolve(
    job_id: str, nodes: Sequence[str], view: RolloutView, pins: Mapping[str, JobPin], *, arm: str = ""
) -> JobPin:
    """The job's pin for ``arm``: the existing one, or a new one from :func:`arm_version` (without its order).

    A pinned job that names nodes outside its pin is refused: its version may not be staged there, a rank
    on such a node would read a different config from the others, and its node order has no place for them.
    """
    if not job_id:
        raise ConfigError("--job-id", f"no job id: pass --job-id or set one of {', '.join(JOB_ID_VARIABLES)}")
    pinned = pins.get(job_id)
    if pinned is not None:
        outside = sorted(set(nodes) - set(pinned.nodes))
        if outside:
            raise ConflictError(
                f"job {job_id} is pinned to {pinned.version or 'NCCL defaults'} on {len(pinned.nodes)} nodes; "
                f"{', '.join(outside[:5])} may not have it and have no place in its node order: "
                "start the job under a new id"
            )
        return pinned
    return JobPin(job_id, arm_version(arm, nodes, view), tuple(sorted(set(nodes))), arm=arm)


def order_environment(order: Sequence[str], *, node: str | None, master_addr: str) -> dict[str, str]:
    """The order variables: ``TOPO_TUNE_NODE_ORDER``, ``TOPO_TUNE_NNODES``, ``TOPO_TUNE_MASTER_ADDR`` and, for
    ``node`` (None: a launcher that starts the other nodes itself), ``TOPO_TUNE_NODE_RANK``.

    A node that is not in the job's order is a `ConfigError` naming ``--node``: a rank there would take
    another node's rank, or none.
    """
    env = {
        "TOPO_TUNE_NODE_ORDER": ",".join(order),
        "TOPO_TUNE_NNODES": str(len(order)),
        "TOPO_TUNE_MASTER_ADDR": master_addr,
    }
    if node is not None:
        if node not in order:
            raise ConfigError(
                "--node",
                f"{node!r} is not one of the job's {len(order)} nodes ({', '.join(order[:5])}"
                f"{', ...' if len(order) > 5 else ''}): pass --node NAME or set TOPO_TUNE_NODE_NAME",
            )
        env["TOPO_TUNE_NODE_RANK"] = str(list(order).index(node))
    return env


def job_environment(
    version: str,
    *,
    config_dir: Path,
    files: Sequence[str] = (NCCL_CONF,),
    tuner_plugin: Path | None = None,
    job_id: str = "",
    learning: LearningPin | None = None,
) -> dict[str, str]:
    """The variables a job on ``version`` needs; ``files`` are the names the version holds. A learning job
    (``learning``) runs its arm's table, timed by the same plugin (``plugin.job_env.learning_env``); any
    other gets exactly what it got before learning existed."""
    env = {"TOPO_TUNE_CONFIG_VERSION": version}
    if job_id:
        env["TOPO_TUNE_JOB_ID"] = job_id
    if not version:
        env["NCCL_CONF_FILE"] = DEFAULTS_FILE
        return env
    env["NCCL_CONF_FILE"] = str(staged_path(config_dir, version, NCCL_CONF)) if NCCL_CONF in files else DEFAULTS_FILE
    if TOPO_FILE in files:
        # Not in nccl.conf: a file can name its own version's path only from outside (the id hashes the files).
        env["NCCL_TOPO_FILE"] = str(staged_path(config_dir, version, TOPO_FILE))
    if learning is not None and tuner_plugin is not None:
        table = challenger_table(learning.arm) if learning.arm else TUNER_TABLE
        if table not in files:
            raise ConfigError("learning_arm", f"arm {learning.arm}: {version} holds no {table}")
        path = staged_path(config_dir, version, table)
        env.update(learning_env(path, tuner_plugin, arm=learning.arm, sample=learning.timing_sample))
    elif TUNER_TABLE in files and tuner_plugin is not None:
        env.update(plugin_env(staged_path(config_dir, version, TUNER_TABLE), tuner_plugin))
    return env


def job_id_from_env(environ: Mapping[str, str]) -> str:
    """The job's id from the launcher's environment (:data:`JOB_ID_VARIABLES`), with its run's instance where
    the launcher exports one (:data:`JOB_INSTANCE_VARIABLES`); "" when none names the job."""
    for name in JOB_ID_VARIABLES:
        value = environ.get(name, "")
        if not value or (name == "TORCHELASTIC_RUN_ID" and value == TORCHRUN_DEFAULT_RUN_ID):
            continue
        instance = environ.get(JOB_INSTANCE_VARIABLES.get(name, ""), "")
        if name == "SLURM_JOB_ID" and not instance and environ.get(SLURM_NODE_LIST):
            # Slurm before 23.02 exports no start time: the allocation's node list tells apart the jobs that
            # matter, those a reused id would hand another job's order (same nodes: the same order is right).
            return f"{value}+n{hashlib.sha256(environ[SLURM_NODE_LIST].encode()).hexdigest()[:12]}"
        if not instance:
            return value
        if name != "SLURM_JOB_ID":
            instance = hashlib.sha256(instance.encode()).hexdigest()[:16]
        return f"{value}+{instance}"
    return ""


def slurm_job_id(environ: Mapping[str, str]) -> str:
    """The id a Slurm job's pin is made under (what ``exec`` inside the job asks with): ``SLURM_JOB_ID``, with
    its start time where Slurm exports it, else its node list's digest."""
    names = ("SLURM_JOB_ID", JOB_INSTANCE_VARIABLES["SLURM_JOB_ID"], SLURM_NODE_LIST)
    return job_id_from_env({name: environ[name] for name in names if name in environ})


def nodes_from_env(environ: Mapping[str, str]) -> list[str]:
    """The job's nodes from ``TOPO_TUNE_NODES`` (comma-separated) or Slurm's node list; [] when neither is set.

    torchrun and mpirun export no node list; pass ``--nodes`` (or ``TOPO_TUNE_NODES``) there, e.g. from the
    hostfile the launcher was given.
    """
    if environ.get("TOPO_TUNE_NODES"):
        nodes = [n for n in (part.strip() for part in environ["TOPO_TUNE_NODES"].split(",")) if n]
        if len(nodes) > MAX_JOB_NODES:
            raise ConfigError(
                "TOPO_TUNE_NODES", f"names {len(nodes)} hosts, more than the {MAX_JOB_NODES} a job may have"
            )
        for node in nodes:
            if not _NODE_NAME.fullmatch(node):
                raise ConfigError(
                    "TOPO_TUNE_NODES", f"not a valid node name: {node[:80]!r} (letters, digits, '-', '_', '.')"
                )
        return nodes
    for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if environ.get(name):
            return expand_hostlist(environ[name], source=name)
    return []


_RANGE = re.compile(r"^(\d{1,9})(?:-(\d{1,9}))?\Z")
_NODE_NAME = re.compile(NODE_NAME_PATTERN)
MAX_JOB_NODES = 100_000
"""The most nodes one job may name: a host list that expands to more is refused before it is expanded."""


def expand_hostlist(hostlist: str, *, source: str = "SLURM_JOB_NODELIST", limit: int = MAX_JOB_NODES) -> list[str]:
    """Expand Slurm's compressed host list: ``gpu[01-03,07],login1`` → gpu01, gpu02, gpu03, gpu07, login1.

    Counted before it is expanded, so ``gpu[0-99999999]`` is refused at once rather than filling memory; a
    reversed range (``gpu[5-1]``) and a name that is not a host name are refused. Errors name ``source``, the
    flag or variable the value came from. (Slurm's own ``scontrol show hostnames`` needs a Slurm client on
    the host; python-hostlist is GPL-licensed: so this small parser of the documented syntax.)
    """
    items = _split_top_level(hostlist, source)
    total = sum(_count(item, hostlist, source) for item in items)
    if total > limit:
        raise ConfigError(source, f"names {total} hosts, more than the {limit} a job may have")
    hosts: list[str] = []
    for item in items:
        for host in _expand_one(item, hostlist, source):
            if not _NODE_NAME.fullmatch(host):
                raise ConfigError(source, f"not a valid node name: {host[:80]!r} (letters, digits, '-', '_', '.')")
            hosts.append(host)
    return hosts


def _split_top_level(text: str, source: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if depth not in (0, 1):
            raise ConfigError(source, f"unbalanced or nested brackets in {text[:80]!r}")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ConfigError(source, f"unbalanced '[' in {text[:80]!r}")
    items.append(current)
    return [i for i in (item.strip() for item in items) if i]


def _ranges(body: str, whole: str, source: str) -> list[tuple[int, int, int]]:
    """(low, high, width) of each range in ``[...]``'s body."""
    out = []
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if not match:
            raise ConfigError(source, f"bad range {part[:40]!r} in {whole[:80]!r}")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ConfigError(source, f"range {part.strip()!r} runs backwards in {whole[:80]!r}")
        out.append((int(low), int(high), len(low)))
    return out


def _count(item: str, whole: str, source: str) -> int:
    start = item.find("[")
    if start < 0:
        return 1
    end = item.find("]", start)
    if end < 0:
        raise ConfigError(source, f"unbalanced '[' in {whole[:80]!r}")
    own = sum(high - low + 1 for low, high, _ in _ranges(item[start + 1 : end], whole, source))
    return own * _count(item[end + 1 :], whole, source)


def _expand_one(item: str, whole: str, source: str) -> list[str]:
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.find("]", start)
    prefix, body, rest = item[:start], item[start + 1 : end], item[end + 1 :]
    tails = _expand_one(rest, whole, source) if rest else [""]
    out: list[str] = []
    for low, high, width in _ranges(body, whole, source):
        for number in range(low, high + 1):
            out.extend(f"{prefix}{number:0{width}d}{tail}" for tail in tails)
    return out
