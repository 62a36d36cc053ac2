"""cluster.yaml: every bad value is named by its field path; the committed JSON Schema is the generated one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from topo_tune.config.cluster import json_schema, json_schema_text, load_cluster_config, loads_cluster_config
from topo_tune.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
HEAD = "apiVersion: topo-tune/v1\n"


def test_example_parses_into_frozen_objects() -> None:
    cluster = load_cluster_config(ROOT / "examples" / "cluster.yaml")
    assert cluster.backend == "nccl"
    assert cluster.controller.heartbeat_interval == 10.0
    assert cluster.rack_of() == {
        "gpu-a1": "rack-a",
        "gpu-a2": "rack-a",
        "gpu-b1": "rack-b",
        "gpu-b2": "rack-b",
    }
    with pytest.raises(Exception, match="frozen"):
        cluster.backend = "sim"  # type: ignore[misc]


def test_a_spine_hashing_flows_over_paths_is_what_the_sim_models_as_ecmp() -> None:
    assert loads_cluster_config(HEAD + "spine: {oversubscription: 3, paths: 4}\n").spine.ecmp_paths == 4  # type: ignore[union-attr]
    adaptive = loads_cluster_config(HEAD + "spine: {paths: 4, hashing: adaptive}\n").spine
    assert adaptive is not None and adaptive.ecmp_paths == 1, "adaptive routing loses nothing to hash collisions"


def test_drift_and_retention_settings_take_durations() -> None:
    text = "controller:\n  drift: {interval: 12h, sampleNodes: 4, openStudy: true}\n  retention: {maxAge: 30d}\n"
    section = loads_cluster_config(HEAD + text).controller
    assert (section.drift.interval, section.drift.sample_nodes, section.drift.open_study) == (43200.0, 4, True)
    assert section.drift.threshold == 0.10 and section.drift.enabled
    assert section.retention.max_age == 30 * 86400.0 and section.retention.ignored_results_per_node == 100


def test_job_caps_and_comparison_retention_are_configured_in_the_controller_section() -> None:
    text = (
        "controller:\n  jobCaps: {pinsPerCredential: 50, rowNodeBytes: 4096}\n  retention: {jobComparisonMaxAge: 7d}\n"
    )
    section = loads_cluster_config(HEAD + text).controller
    assert (section.job_caps.pins_per_credential, section.job_caps.row_node_bytes) == (50, 4096)
    assert (
        section.job_caps.comparisons_per_credential == 1_000 and section.retention.job_comparison_max_age == 7 * 86400.0
    )
    with pytest.raises(ConfigError, match=r"controller\.jobCaps\.pinsPerCredential"):
        loads_cluster_config(HEAD + "controller:\n  jobCaps: {pinsPerCredential: 0}\n")
    timings = loads_cluster_config(
        HEAD + "controller:\n  retention: {jobTimingMaxAge: 14d, jobTimingMaxRecords: 5000}\n"
    )
    retention = timings.controller.retention
    assert (retention.job_timing_max_age, retention.job_timing_max_records) == (14 * 86400.0, 5000)
    with pytest.raises(ConfigError, match=r"controller\.retention\.jobTimingMaxRecords"):
        loads_cluster_config(HEAD + "controller:\n  retention: {jobTimingMaxRecords: 0}\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "racks:\n- {name: r0, nodes: [{name: a}]}\n- {name: r1, nodes: [{name: b}]}\n"
            "- {name: r2, nodes: [{name: c, gpus: eight}]}\n",
            "racks[2].nodes[0].gpus: expected integer, got 'eight'",
        ),
        ("racks:\n- {name: r0, nodes: [{name: a, gpu: 8}]}\n", "racks[0].nodes[0].gpu: unknown key"),
        ("controler: {}\n", "controler: unknown key; did you mean 'controller'?"),
        ("search: {budjet: 4}\n", "search.budjet: unknown key; did you mean 'budget'?"),
        (
            "racks:\n- {name: r0, nodez: [{name: a}]}\n",
            "racks[0].nodes: required field is missing; racks[0].nodez: unknown key; did you mean 'nodes'?",
        ),
        ("search: null\n", "search: expected a mapping, got null (an empty value)"),
        ("backend: mpi\n", "backend: input should be 'nccl', 'gloo' or 'sim'"),
        ("racks:\n- {name: r0, nodes: []}\n", "racks[0].nodes: list should have at least 1 item"),
        ("racks:\n- {nodes: [{name: a}]}\n", "racks[0].name: required field is missing"),
        (
            "racks:\n- {name: r0, nodes: [{name: a}]}\n- {name: r1, nodes: [{name: a}]}\n",
            "racks[1].nodes[0].name: duplicate node name 'a' (also racks[0].nodes[0])",
        ),
        ("racks:\n- {name: 'bad name', nodes: [{name: a}]}\n", "racks[0].name: expected a host name (RFC 1123"),
        ("controller: {heartbeatInterval: soon}\n", "controller.heartbeatInterval: expected a duration"),
        (
            "controller: {heartbeatInterval: 30s, heartbeatExpiry: 10s}\n",
            "controller: heartbeatExpiry must be longer than heartbeatInterval",
        ),
        (
            "controller: {listen: nowhere}\n",
            "controller.listen: expected HOST:PORT, e.g. 127.0.0.1:50051, got 'nowhere'",
        ),
        ("racks: {name: r0}\n", "racks: expected a list"),
        ("controller: {drift: {threshold: 1.5}}\n", "controller.drift.threshold: input should be less than 1"),
        ("controller: {retention: {maxAge: forever}}\n", "controller.retention.maxAge: expected a duration"),
        ("controller: {drift: {sampleNode: 2}}\n", "controller.drift.sampleNode: unknown key"),
        ("spine: {paths: 0}\n", "spine.paths: input should be greater than or equal to 1"),
        ("spine: {paths: 4, hashing: random}\n", "spine.hashing: input should be 'ecmp' or 'adaptive'"),
        ("backend: gloo\nsearch: {cudaGraph: true}\n", "search.cudaGraph: CUDA graphs need backend nccl, not gloo"),
        ("search: {jobDeadline: 500ms}\n", "search.jobDeadline: input should be greater than or equal to 1"),
        ("search: {jobDeadline: 2d}\n", "search.jobDeadline: input should be less than or equal to 86400"),
        (
            "backend: sim\nrollout: {gate: {cudaGraph: true}}\n",
            "rollout.gate.cudaGraph: CUDA graphs need backend nccl, not sim",
        ),
    ],
)
def test_bad_values_name_their_field(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        loads_cluster_config(HEAD + text)
    assert str(caught.value).startswith(message)


def test_every_bad_field_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        loads_cluster_config(HEAD + "backend: x\nracks:\n- {name: r0, nodes: [{name: a, gpus: -1}]}\n")
    assert "backend:" in str(caught.value)
    assert "racks[0].nodes[0].gpus: input should be greater than or equal to 0" in str(caught.value)


def test_wrong_api_version_and_shape() -> None:
    with pytest.raises(ConfigError, match=r"apiVersion: expected 'topo-tune/v1', got 'v2'"):
        loads_cluster_config("apiVersion: v2\n")
    with pytest.raises(ConfigError, match="apiVersion: required field is missing"):
        loads_cluster_config("backend: sim\n")
    with pytest.raises(ConfigError, match="expected a mapping at the top level"):
        loads_cluster_config("- a\n- b\n")


def test_yaml_syntax_error_names_line_and_column() -> None:
    with pytest.raises(ConfigError, match=r"cluster.yaml:3:\d+: not valid YAML"):
        loads_cluster_config(HEAD + "backend: sim\nracks: a: b\n")


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [
        ("backend: sim\nracks: []\nbackend: nccl\n", "backend", (2, 4)),
        ("racks:\n- name: r0\n  nodes: []\n  name: r1\n", "name", (3, 5)),
        ("controller: {heartbeatInterval: 1s, heartbeatInterval: 2s}\n", "heartbeatInterval", (2, 2)),
        ('backend: sim\n"backend": nccl\n', "backend", (2, 3)),
    ],
    ids=["top", "nested", "flow", "quoted"],
)
def test_a_key_given_twice_is_an_error_naming_the_key_and_both_lines(
    text: str, key: str, lines: tuple[int, int]
) -> None:
    with pytest.raises(ConfigError) as caught:
        loads_cluster_config(HEAD + text)
    message = str(caught.value)
    assert f"not valid YAML: duplicate key {key!r} on lines {lines[0]} and {lines[1]}" in message, message
    assert message.startswith(f"cluster.yaml:{lines[1]}:")


def test_the_same_key_in_two_mappings_is_no_duplicate() -> None:
    text = "racks:\n- {name: r0, nodes: [{name: a}]}\n- {name: r1, nodes: [{name: b}]}\n"
    assert [rack.name for rack in loads_cluster_config(HEAD + text).racks] == ["r0", "r1"]


def test_unreadable_file() -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_cluster_config(Path("/nonexistent/cluster.yaml"))


def test_durations_accept_units() -> None:
    cluster = loads_cluster_config(HEAD + "controller: {heartbeatInterval: 500ms, heartbeatExpiry: 2m}\n")
    assert cluster.controller.heartbeat_interval == 0.5
    assert cluster.controller.heartbeat_expiry == 120.0


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("controller: {heartbeatInterval: .inf}", "controller.heartbeatInterval"),
        ("controller: {drift: {interval: .inf}}", "controller.drift.interval"),
        ("controller: {drift: {threshold: .nan}}", "controller.drift.threshold"),
        ("spine: {bandwidthGbps: .inf}", "spine.bandwidthGbps"),
        ("workload: {collectives: {all_reduce: 1}, collectiveTimeUs: .nan}", "workload.collectiveTimeUs"),
    ],
)
def test_infinite_and_nan_settings_are_refused_naming_the_key(section: str, key: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(key)):
        loads_cluster_config(HEAD + section + "\n")


def test_committed_schema_is_generated() -> None:
    committed = (ROOT / "docs" / "cluster.schema.json").read_text()
    assert committed == json_schema_text(), "docs/cluster.schema.json is stale: topo-tune config schema > it"


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_satisfy_the_schema(example: Path) -> None:
    document = yaml.safe_load(example.read_text())
    jsonschema.validate(document, json_schema())
    load_cluster_config(example)


def test_schema_rejects_what_the_parser_rejects() -> None:
    schema = json_schema()
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"apiVersion": "topo-tune/v1", "bogus": 1}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            {"apiVersion": "topo-tune/v1", "racks": [{"name": "r", "nodes": [{"name": "a", "gpus": "x"}]}]},
            schema,
        )
    assert json.loads(json_schema_text())["title"] == "topo-tune cluster.yaml"


@pytest.mark.parametrize(
    ("text", "search", "gate"),
    [
        ("backend: nccl\n", True, True),  # graph timing is the nccl default, for the study and the gates
        ("backend: nccl\nsearch: {cudaGraph: false}\nrollout: {gate: {cudaGraph: false}}\n", False, False),
        ("backend: nccl\nsearch: {budget: 5}\nrollout: {gate: {repeats: 3}}\n", True, True),
        ("backend: gloo\n", False, False),
        ("backend: sim\n", False, False),
    ],
)
def test_graph_timing_is_the_nccl_default_and_eager_an_explicit_choice(text: str, search: bool, gate: bool) -> None:
    cluster = loads_cluster_config(HEAD + text)
    assert (cluster.search.cuda_graph, cluster.rollout.gate.cuda_graph) == (search, gate)
    assert loads_cluster_config(yaml.safe_dump(cluster.model_dump(by_alias=True))) == cluster, "round-trips"


def test_one_box_example_is_a_graph_timed_nccl_node_with_nvls_off() -> None:
    cluster = load_cluster_config(ROOT / "examples" / "one-box.yaml")
    (node,) = (node for rack in cluster.racks for node in rack.nodes)
    assert cluster.backend == "nccl" and cluster.controller.address is None
    assert cluster.search.cuda_graph and node.worker_env == {"NCCL_NVLS_ENABLE": "0"}


def _alias_bomb(levels: int = 9, width: int = 9) -> str:
    """``levels`` anchors, each a list of ``width`` aliases of the one before: ``width ** levels`` leaves."""
    lines = ["apiVersion: topo-tune/v1", "racks:", "  - name: r0", '    labels: {a0: &a0 ["x"]}']
    for level in range(1, levels + 1):
        items = ", ".join([f"*a{level - 1}"] * width)
        lines.append(f"  - name: r{level}")
        lines.append(f"    labels: {{a{level}: &a{level} [{items}]}}")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_in_racks_is_refused_before_it_expands(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(_alias_bomb())
    with pytest.raises(ConfigError) as caught:
        load_cluster_config(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.endswith("refused: more than 1000000 values once aliases are expanded (an alias bomb?)")
    assert str(path) in message


def test_aliases_that_stay_small_are_still_yaml() -> None:
    text = "apiVersion: topo-tune/v1\nracks:\n  - {name: r1, nodes: [{name: a, gpus: &g 8}, {name: b, gpus: *g}]}\n"
    config = loads_cluster_config(text)
    assert [node.gpus for node in config.racks[0].nodes] == [8, 8]


@pytest.mark.parametrize("opening", ["[", "{a: "], ids=["lists", "mappings"])
def test_deep_nesting_is_one_line_naming_the_bound_not_a_recursion_error(opening: str) -> None:
    closing = "]" if opening == "[" else "}"
    text = "apiVersion: topo-tune/v1\nracks: " + opening * 5000 + "1" + closing * 5000 + "\n"
    with pytest.raises(ConfigError) as caught:
        loads_cluster_config(text)
    message = str(caught.value)
    assert "\n" not in message
    assert "nested more than 64 levels deep" in message
    assert message.startswith("cluster.yaml: refused: line 2:")


def test_a_file_larger_than_the_bound_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    with path.open("wb") as handle:
        handle.truncate(16 * 1024 * 1024 + 1)  # sparse: nothing is written, the size is what counts
    with pytest.raises(ConfigError, match=r"larger than 16 MiB$"):
        load_cluster_config(path)


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [(["ini"], "Did you mean 'init'?"), (["admin", "rollot"], "Did you mean 'rollout'?")],
)
def test_a_mistyped_command_gets_the_closest_one(argv: list[str], suggestion: str) -> None:
    from click.testing import CliRunner

    from topo_tune.cli.main import cli

    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 2 and suggestion in result.output
