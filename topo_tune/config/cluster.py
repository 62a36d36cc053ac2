"""``cluster.yaml`` (``apiVersion: topo-tune/v1``): parsed once at the edge into frozen, typed objects.

Every key is spelled in lowerCamelCase as in Kubernetes manifests. An unknown key or a bad value is rejected
with the path of the field, e.g. ``racks[2].nodes[0].gpus: expected integer, got 'eight'``. The JSON Schema
of the file (``topo-tune config schema``, committed as ``docs/cluster.schema.json``) is generated from the
same definitions, so the two cannot disagree.

Non-goal: this module reads no environment variable and starts nothing; the CLI merges command-line flags
over what it returns.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from topo_tune.benchmark.job_spec import MAX_DEADLINE_S
from topo_tune.benchmark.sweep import size_ladder
from topo_tune.config import bounded_yaml
from topo_tune.config.checks import validated
from topo_tune.config.values import BackendName, ByteSize, Duration, HostName, HostPort, NodeNameSetting
from topo_tune.errors import ConfigError, PathError, YamlLimitError
from topo_tune.ids import BucketName
from topo_tune.nccl.backends import Backend
from topo_tune.versions.layout import DEFAULT_CONFIG_DIR

API_VERSION: Final = "topo-tune/v1"


SamplerName = Literal["tpe", "random", "cmaes", "coordinate"]


def _no_schema_default(schema: dict[str, Any]) -> None:
    """For a field whose default depends on another (the description says which): the schema shows none."""
    schema.pop("default", None)


class _Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        strict=False,
        allow_inf_nan=False,  # no setting is infinite or NaN; they would pass every comparison or overflow
    )


class TlsConfig(_Section):
    """TLS for the controller's gRPC port; mutual TLS when ``clientCaFile`` is set."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None


class DriftConfig(_Section):
    """The periodic drift check: the active config version re-measured on a few idle nodes of one wave."""

    enabled: bool = True
    interval: Duration = Field(
        default=6 * 3600.0, description="how often the active config version is re-measured on idle nodes"
    )
    sample_nodes: int = Field(default=2, ge=1, le=1024, description="nodes measured per check, from one wave")
    repeats: int = Field(default=3, ge=2, le=100, description="benchmark jobs per check: the test's samples")
    threshold: float = Field(
        default=0.10,
        gt=0,
        lt=1,
        description="a bus-bandwidth drop beyond this fraction of the reference alerts, when significant at alpha",
    )
    alpha: float = Field(
        default=0.05, gt=0, lt=0.5, description="significance level of the drop's test (Welch, one-sided)"
    )
    open_study: bool = Field(default=False, description="open a study on a regression or a changed topology")


class RetentionConfig(_Section):
    """How long benchmark results, events, drift checks, job comparisons and learning jobs' timing records are
    kept (gate samples and chosen trials stay)."""

    enabled: bool = True
    max_age: Duration = Field(
        default=90 * 86400.0, description="benchmark results, events and drift checks older than this are deleted"
    )
    job_comparison_max_age: Duration = Field(
        default=30 * 86400.0, description="jobs' own A/B comparisons (`exec --compare`) older than this are deleted"
    )
    job_timing_max_age: Duration = Field(
        default=90 * 86400.0,
        description="learning jobs' timing records are deleted, a job's all together, when its newest is older",
    )
    job_timing_max_records: int = Field(
        default=1_000_000,
        ge=1,
        le=100_000_000,
        description="timing records kept at most: beyond, the oldest jobs' go, each job's all together",
    )
    interval: Duration = Field(default=3600.0, description="how often the retention pass runs")
    batch_size: int = Field(default=500, ge=1, le=100_000, description="rows deleted per transaction")
    ignored_results_per_node: int = Field(
        default=100, ge=1, le=100_000, description="`result.ignored` events kept per node (the newest)"
    )


class JobCapsConfig(_Section):
    """How much one job credential may store, and how large one pin or comparison may be (the admin is not
    capped); a call past a cap is refused before anything is stored."""

    pins_per_credential: int = Field(
        default=10_000, ge=1, le=10_000_000, description="job pins one job credential holds"
    )
    comparisons_per_credential: int = Field(
        default=1_000, ge=1, le=1_000_000, description="job comparisons (`exec --compare`) one job credential holds"
    )
    row_node_bytes: int = Field(
        default=1 << 20, ge=1, le=4 << 20, description="bytes of node names in one job pin or comparison"
    )


class ControllerConfig(_Section):
    """Where the controller runs and how it keeps its state."""

    address: HostPort | None = Field(
        default=None, description="a remote controller to use; unset: `topo-tune init` embeds one"
    )
    listen: HostPort = Field(default="127.0.0.1:50051", description="HOST:PORT of the gRPC services")
    database: str = Field(
        default="sqlite:///topo-tune.db", min_length=1, description="the SQLAlchemy URL of the controller's database"
    )
    metrics_listen: HostPort | None = Field(default=None, description="HOST:PORT of Prometheus /metrics; unset: off")
    health_listen: HostPort | None = Field(
        default=None,
        description="HOST:PORT of a plaintext gRPC health port, for kubelet probes when the main port uses mTLS; "
        "unset: off",
    )
    token_file: str | None = Field(
        default=None,
        description="file holding the admin token; --token-file and $TOPO_TUNE_TOKEN win over it",
    )
    tls: TlsConfig | None = None
    heartbeat_interval: Duration = Field(default=10.0, description="how often agents heartbeat")
    heartbeat_expiry: Duration = Field(default=30.0, description="silence after which a node is `lost`")
    drift: DriftConfig = Field(default_factory=DriftConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    job_caps: JobCapsConfig = Field(default_factory=JobCapsConfig)

    @model_validator(mode="after")
    def _expiry_exceeds_interval(self) -> ControllerConfig:
        if self.heartbeat_expiry <= self.heartbeat_interval:
            raise ValueError("heartbeatExpiry must be longer than heartbeatInterval")
        return self


class NodeConfig(_Section):
    """One node of the cluster."""

    name: NodeNameSetting
    address: str | None = Field(default=None, description="address benchmarks use; unset: the agent's own")
    gpus: int = Field(default=8, ge=0, le=1024, description="GPUs on the node (used by the sim backend)")
    labels: dict[str, str] = Field(default_factory=dict)
    worker_env: dict[str, str] = Field(
        default_factory=dict,
        description="variables every benchmark worker on this node gets, over any trial's value (`agent run "
        "--worker-env`), e.g. {NCCL_NVLS_ENABLE: '0'} where NVLink multicast must stay off; `topo-tune init` "
        "gives them to the agent it starts and prints them in the `agent run` line for other nodes",
    )


class RackConfig(_Section):
    """A rack: the unit of a rollout wave and of the spine model."""

    name: HostName
    nodes: list[NodeConfig] = Field(min_length=1)


class SpineConfig(_Section):
    """The links between racks, when they are slower than inside a rack."""

    bandwidth_gbps: float | None = Field(default=None, gt=0, description="per-node bandwidth across the spine")
    oversubscription: float | None = Field(default=None, ge=1, description="e.g. 4 for a 4:1 spine")
    paths: int = Field(
        default=1, ge=1, le=1024, description="equal-cost paths between the racks (spine switches or uplinks)"
    )
    hashing: Literal["ecmp", "adaptive"] = Field(
        default="ecmp",
        description="how flows spread over the paths: ecmp hashes each flow onto one path, so flows collide "
        "and leave paths idle; adaptive (adaptive routing, packet spraying) spreads them evenly",
    )

    @property
    def ecmp_paths(self) -> int:
        """Paths that lose throughput to hash collisions (the sim's ``Spine.ecmp_paths``; 1 = no such loss)."""
        return self.paths if self.hashing == "ecmp" else 1


class WorkloadConfig(_Section):
    """What the cluster's jobs spend their communication on: relative weights."""

    collectives: dict[str, float] = Field(
        default_factory=lambda: {"all_reduce": 1.0},
        description="collective -> weight, e.g. {all_reduce: 3, all_gather: 1}",
    )
    buckets: dict[BucketName, float] = Field(default_factory=dict, description="size bucket -> weight (default 1 each)")
    weights: dict[str, dict[BucketName, float]] | None = Field(
        default=None,
        description="collective -> size bucket -> weight, each (collective, bucket) on its own (as `topo-tune "
        "workload import` writes it: its share of the job's collective time); a bucket it does not name weighs 0. "
        "Replaces collectives and buckets, which must then be left out",
    )
    source: str | None = Field(default=None, description="where the weights came from, shown in the report")
    collective_time_us: float | None = Field(
        default=None,
        gt=0,
        description="the job's collective time per rank (us) over what was imported, in the weights' baseline: "
        "the report predicts how much of it the tuned config saves",
    )

    @model_validator(mode="before")
    @classmethod
    def _matrix(cls, data: Any) -> Any:
        """With ``weights``, ``collectives`` is derived (each row's sum): the rest of the tuner reads it as before."""
        if not isinstance(data, Mapping) or not isinstance(data.get("weights"), Mapping):
            return data
        rows = {c: row for c, row in data["weights"].items() if isinstance(row, Mapping)}
        derived = {c: float(sum(v for v in row.values() if isinstance(v, int | float))) for c, row in rows.items()}
        if data.get("buckets"):
            raise ValueError("weights replaces buckets: leave buckets out")
        if "collectives" in data and dict(data["collectives"]) != derived:
            raise ValueError("weights replaces collectives: leave collectives out")
        return {**data, "collectives": derived}


PROOF_ALPHA: Final = 0.01
"""The proof's significance level per finalist (one definition: statistics and the schema read it here)."""
PROOF_MIN_EFFECT: Final = 0.03
"""The smallest gain worth promoting (``search.minEffect``)."""
PROOF_MAX_LOSS: Final = 0.02
"""The largest loss a promoted config may have in any weighted bucket (``search.maxLoss``)."""


class SearchConfig(_Section):
    """How `topo-tune init` searches and proves."""

    budget: int = Field(default=60, ge=1, le=100_000, description="trials, the baseline included")
    sampler: SamplerName = Field(
        default="tpe", description="how trials are proposed (Optuna's TPE, random, CMA-ES, or one knob at a time)"
    )
    seed: int = Field(default=0, ge=0, description="the sampler's seed")
    min_bytes: ByteSize = Field(default=256, description="smallest message size of the size ladder")
    max_bytes: ByteSize = Field(default=1 << 30, description="largest message size of the size ladder")
    step_factor: int = Field(default=4, ge=2, le=1024, description="the size ladder's multiplier")
    knobs: list[str] | None = Field(default=None, description="search only these knobs; unset: every safe knob")
    rungs: int = Field(default=3, ge=1, le=16, description="steps of the size ladder at which weak trials are pruned")
    finalists: int = Field(default=3, ge=0, le=20, description="best trials proven against the defaults at the end")
    proof_pairs: int = Field(
        default=10, ge=2, le=1000, description="interleaved baseline/candidate pairs per look of the proof"
    )
    proof_pairs_max: int = Field(
        default=30,
        ge=2,
        le=1000,
        description="pairs a finalist may get in all, in looks of proofPairs, while a weighted bucket is neither "
        "shown safe nor shown slower (below proofPairs: one look of proofPairs)",
    )
    min_effect: float = Field(default=PROOF_MIN_EFFECT, ge=0, lt=1, description="smallest gain worth promoting")
    max_loss: float = Field(
        default=PROOF_MAX_LOSS,
        ge=0,
        lt=1,
        description="largest loss a promoted config may have in any weighted bucket: each one's lower confidence "
        "bound of the speedup must be at least 1 - maxLoss",
    )
    nccl_version: str | None = Field(default=None, description="unset: what the agents report")
    probe_sampling: Literal["auto", "full", "sparse"] = Field(
        default="auto",
        description="node-pair probes: full (every pair, about n rounds), sparse (rack rings, samples between "
        "racks sized by their spread, escalation around slow pairs; the rest inferred from the rack model), "
        "auto: sparse above 64 nodes",
    )
    iters: int = Field(default=20, ge=1, le=10_000, description="timed iterations per size")
    warmup_iters: int = Field(default=5, ge=0, le=10_000, description="warm-up iterations per size")
    job_deadline: Duration = Field(
        default=600.0, ge=1.0, le=MAX_DEADLINE_S, description="deadline of each benchmark job (1 s to 24 h)"
    )
    tuner_table: bool = Field(
        default=True,
        description="after the search, measure a tuner-plugin table composed from the per-size winners, and ship "
        "the plugin table the proof chose (nccl and sim backends; gloo never loads NCCL's plugin); false: "
        "environment settings only, no table trial and no nccl_tuner.conf rows",
    )
    cuda_graph: bool = Field(
        default=False,
        description="time every trial's sizes as CUDA graphs (nccl-tests -G; backend nccl only). Unset: true "
        "with backend nccl, false with gloo and sim. false (eager) times each torch.distributed call, which "
        "costs the CPU 25-45 us of launch and hides what the knobs do below a few MiB",
        json_schema_extra=_no_schema_default,
    )

    @model_validator(mode="after")
    def _ladder(self) -> SearchConfig:
        if not size_ladder(min_bytes=self.min_bytes, max_bytes=self.max_bytes, step_factor=self.step_factor):
            raise ValueError("maxBytes must not be below minBytes")
        return self


class RolloutGateConfig(_Section):
    """A wave gate's verification benchmark: all_reduce over the wave's nodes, one job per version and repeat.

    The site's defaults (``rollout.gate``), overridden per rollout (``admin rollout create --gate-*``) and
    stored with it, so a resumed controller measures every wave of it the same way. The defaults suit GPU
    fabrics; a slow or noisy fabric wants a single large-enough size and more repeats, so that a repeat's time
    is dominated by the link, not by the workers' start-up. Drift checks measure as the stable rollout's
    gates did.
    """

    repeats: int = Field(default=8, ge=1, le=1000, description="interleaved A/B repeats (two jobs each)")
    min_bytes: ByteSize = Field(default=1 << 20, description="smallest all_reduce size of the gate benchmark")
    max_bytes: ByteSize = Field(default=1 << 28, description="largest all_reduce size of the gate benchmark")
    step_factor: int = Field(default=4, ge=2, le=1024, description="the size ladder's multiplier")
    iters: int = Field(default=20, ge=1, le=10_000, description="timed iterations per size")
    warmup_iters: int = Field(default=5, ge=1, le=10_000, description="warm-up iterations per size")
    cuda_graph: bool = Field(
        default=False,
        description="time each size as CUDA graphs (nccl-tests -G; backend nccl only), as search.cudaGraph does "
        "for the study. Unset: true with backend nccl, false with gloo and sim; false (eager) adds the CPU's "
        "launch cost to every call. Drift checks measure as the gates did",
        json_schema_extra=_no_schema_default,
    )

    @model_validator(mode="after")
    def _ladder(self) -> RolloutGateConfig:
        if not size_ladder(min_bytes=self.min_bytes, max_bytes=self.max_bytes, step_factor=self.step_factor):
            raise ValueError("maxBytes must not be below minBytes")
        return self


class RolloutThresholdsConfig(_Section):
    """What a wave's gate judges by (docs/rollout.md; ``admin rollout create --threshold`` overrides)."""

    min_gain: float = Field(
        default=0.03, ge=-0.5, lt=1, description="time gain to show; negative: a non-inferiority margin"
    )
    alpha: float = Field(default=0.01, gt=0, lt=0.5, description="significance level of every test")
    max_regression: float = Field(default=0.03, ge=0, lt=1, description="a significant slowdown beyond this fails")
    max_p99_regression: float = Field(default=0.05, ge=0, lt=1)
    max_cv: float = Field(default=0.09, ge=0, lt=1, description="bus-bandwidth CV above this is inconclusive")
    max_drop: float = Field(
        default=0.2, ge=0, lt=1, description="busbw drop against an earlier wave of as many nodes that fails"
    )

    @property
    def min_pairs(self) -> int:
        """Fewer A/B pairs than this can never reach ``alpha`` (the sign-flip test's smallest p is 2^-n)."""
        return math.ceil(math.log2(1 / self.alpha))


class RolloutConfig(_Section):
    """Defaults of every rollout's gates (`admin rollout create --gate-*`/`--threshold` override them)."""

    gate: RolloutGateConfig = Field(default_factory=RolloutGateConfig)
    thresholds: RolloutThresholdsConfig = Field(default_factory=RolloutThresholdsConfig)
    agent_config_dir: str = Field(
        default=str(DEFAULT_CONFIG_DIR),
        min_length=1,
        description="where the agents stage config versions, the same path on every node (gate jobs point there)",
    )


class LearningConfig(_Section):
    """Production jobs teaching the tuner (``docs/learning.md``): the cluster's one switch, off by default.

    On, a job of a version that carries challenger tables may run one of them for its whole life (its arm,
    drawn from the version and the job id and pinned with the job), and every such job is timed by the
    plugin's profiler; a version's kill switch (``admin learning version ID --off``) and a job's
    ``TOPO_TUNE_LEARNING=off`` each turn it off below this switch."""

    enabled: bool = Field(default=False, description="let jobs of versions with challengers explore them")
    explore_share: float = Field(
        default=0.1,
        ge=0,
        le=0.5,  # learning.assignment.MAX_EXPLORE_SHARE (config sits below learning; a test pins the two)
        description="the fraction of a version's jobs that run a challenger (all challengers together), at most half",
    )
    timing_sample: int = Field(
        default=64,
        ge=1,
        le=1 << 20,
        description="the profiler times one call in this many of a learning job's collectives "
        "(TOPO_TUNE_TIMING_SAMPLE)",
    )


class Metadata(_Section):
    name: HostName = "topo-tune"


class ClusterConfig(_Section):
    """The whole ``cluster.yaml``."""

    api_version: Literal["topo-tune/v1"]
    kind: Literal["Cluster"] = "Cluster"
    metadata: Metadata = Field(default_factory=Metadata)
    controller: ControllerConfig = Field(default_factory=ControllerConfig)
    backend: BackendName = Backend.SIM
    rack_label: str = Field(
        default="topology.kubernetes.io/rack", description="Kubernetes node label that names a node's rack"
    )
    racks: list[RackConfig] = Field(default_factory=list)
    spine: SpineConfig | None = None
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    learning: LearningConfig = Field(default_factory=LearningConfig)
    site_fixed: dict[str, str] = Field(
        default_factory=dict,
        description="NCCL settings fixed by the site (IB HCA, GID index, traffic class, socket interface); "
        "passed unchanged into every trial and output",
    )

    @model_validator(mode="after")
    def _unique_names(self) -> ClusterConfig:
        racks: dict[str, int] = {}
        nodes: dict[str, tuple[int, int]] = {}
        for i, rack in enumerate(self.racks):
            if rack.name in racks:
                raise PathError(f"racks[{i}].name", f"duplicate rack name {rack.name!r}")
            racks[rack.name] = i
            for j, node in enumerate(rack.nodes):
                if node.name in nodes:
                    ri, nj = nodes[node.name]
                    raise PathError(
                        f"racks[{i}].nodes[{j}].name",
                        f"duplicate node name {node.name!r} (also racks[{ri}].nodes[{nj}])",
                    )
                nodes[node.name] = (i, j)
        # Graph timing is the nccl default: eager timing measures Python's launch cost below a few MiB.
        if self.backend.runs_nccl and "cuda_graph" not in self.search.model_fields_set:
            object.__setattr__(self, "search", self.search.model_copy(update={"cuda_graph": True}))
        gate = self.rollout.gate
        if self.backend.runs_nccl and "cuda_graph" not in gate.model_fields_set:
            gate = gate.model_copy(update={"cuda_graph": True})
            object.__setattr__(self, "rollout", self.rollout.model_copy(update={"gate": gate}))
        if self.search.cuda_graph and not self.backend.runs_nccl:
            raise PathError("search.cudaGraph", f"CUDA graphs need backend nccl, not {self.backend}")
        if self.rollout.gate.cuda_graph and not self.backend.runs_nccl:
            raise PathError("rollout.gate.cudaGraph", f"CUDA graphs need backend nccl, not {self.backend}")
        return self

    def rack_of(self) -> dict[str, str]:
        """Node name → rack name, for every node the file lists."""
        return {node.name: rack.name for rack in self.racks for node in rack.nodes}


def parse_cluster_config(data: object, *, source: str = "cluster.yaml") -> ClusterConfig:
    """Validate an already-loaded document. Raises ``ConfigError`` naming every bad field."""
    if not isinstance(data, Mapping):
        raise ConfigError("", f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    if data.get("apiVersion") not in (None, API_VERSION):
        raise ConfigError("apiVersion", f"expected {API_VERSION!r}, got {data.get('apiVersion')!r}")
    return validated(ClusterConfig, data)


def load_cluster_config(path: Path) -> ClusterConfig:
    """Read and validate a ``cluster.yaml``."""
    try:
        if path.stat().st_size > bounded_yaml.MAX_BYTES:
            raise ConfigError("", f"{path}: larger than {bounded_yaml.MAX_BYTES // (1024 * 1024)} MiB")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("", f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError("", f"{path}: not UTF-8 text (byte {exc.start})") from None
    return loads_cluster_config(text, source=str(path))


def loads_cluster_config(text: str, *, source: str = "cluster.yaml") -> ClusterConfig:
    """Validate ``cluster.yaml`` text."""
    try:
        data: Any = bounded_yaml.load(text)
    except YamlLimitError as exc:
        raise ConfigError("", f"{source}: refused: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())  # one line, as PyYAML's may not be
        raise ConfigError("", f"{where}: not valid YAML: {problem}") from None
    return parse_cluster_config(data, source=source)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of ``cluster.yaml``."""
    schema = ClusterConfig.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "topo-tune cluster.yaml"
    return schema


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
