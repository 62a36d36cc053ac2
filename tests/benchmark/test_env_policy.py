"""The agent is not a remote shell: each refused class of variable, and what stays allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from topo_tune.benchmark.env_policy import EnvPolicy, EnvPolicyError


@pytest.fixture
def policy(tmp_path: Path) -> EnvPolicy:
    (tmp_path / "config").mkdir()
    (tmp_path / "plugins").mkdir()
    return EnvPolicy(config_dirs=(tmp_path / "config",), plugin_dirs=(tmp_path / "plugins",))


def _refused(policy: EnvPolicy, env: dict[str, str]) -> dict[str, str]:
    with pytest.raises(EnvPolicyError) as info:
        policy.check(env)
    return {v.key: v.reason for v in info.value.violations}


def test_searchable_and_site_knobs_are_accepted(policy: EnvPolicy, tmp_path: Path) -> None:
    policy.check(
        {
            "NCCL_MIN_CTAS": "16",
            "NCCL_MAX_CTAS": "16",
            "NCCL_NTHREADS": "256",
            "NCCL_BUFFSIZE": "16777216",
            "NCCL_ALGO": "Ring",
            "NCCL_PROTO": "^LL128",
            "NCCL_NVLS_ENABLE": "0",
            "NCCL_P2P_LEVEL": "NVL",
            "NCCL_IB_TIMEOUT": "20",
            "NCCL_SOCKET_NTHREADS": "4",
            "NCCL_NSOCKS_PERTHREAD": "4",
            "NCCL_TUNER_PLUGIN": str(tmp_path / "plugins" / "libnccl-tuner-topo.so"),
            "NCCL_NET_PLUGIN": "none",
            "NCCL_TOPO_FILE": str(tmp_path / "config" / "topo.xml"),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        }
    )


@pytest.mark.parametrize(
    "key", ["LD_PRELOAD", "LD_LIBRARY_PATH", "PATH", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "BASH_ENV"]
)
def test_loader_and_interpreter_variables_are_refused(policy: EnvPolicy, key: str) -> None:
    assert "loader/interpreter" in _refused(policy, {key: "/tmp/evil"})[key]


@pytest.mark.parametrize("key", ["HOME", "GLOO_SOCKET_IFNAME", "MY_VAR", "OMP_NUM_THREADS", "nccl_debug"])
def test_anything_not_allow_listed_is_refused(policy: EnvPolicy, key: str) -> None:
    reason = _refused(policy, {key: "x"})[key]
    assert "allow-listed" in reason or "valid variable name" in reason


def test_gpu_placement_cannot_come_from_the_environment(policy: EnvPolicy) -> None:
    assert "rank map" in _refused(policy, {"CUDA_VISIBLE_DEVICES": "1"})["CUDA_VISIBLE_DEVICES"]


@pytest.mark.parametrize("key", ["NCCL_TUNER_PLUGIN", "NCCL_NET_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN"])
def test_plugins_outside_the_plugin_dirs_are_refused(policy: EnvPolicy, tmp_path: Path, key: str) -> None:
    assert "outside" in _refused(policy, {key: "/usr/lib/libevil.so"})[key]
    assert "absolute path" in _refused(policy, {key: "libevil.so"})[key]
    # '..' and symlinks cannot climb out of the directory.
    assert "outside" in _refused(policy, {key: str(tmp_path / "plugins" / ".." / "evil.so")})[key]
    link = tmp_path / "plugins" / "link.so"
    link.symlink_to("/usr/lib/libevil.so")
    assert "outside" in _refused(policy, {key: str(link)})[key]


@pytest.mark.parametrize(
    "key",
    ["NCCL_TOPO_FILE", "NCCL_CONF_FILE", "NCCL_TOPO_DUMP_FILE", "NCCL_DEBUG_FILE", "NCCL_TUNER_CONFIG_FILE"],
)
def test_files_outside_the_config_dirs_are_refused(policy: EnvPolicy, key: str) -> None:
    assert "outside" in _refused(policy, {key: "/etc/passwd"})[key]


def test_graph_file_needs_expert_mode(policy: EnvPolicy, tmp_path: Path) -> None:
    graph = str(tmp_path / "config" / "graph.xml")
    assert "expert mode" in _refused(policy, {"NCCL_GRAPH_FILE": graph})["NCCL_GRAPH_FILE"]
    EnvPolicy(config_dirs=(tmp_path / "config",), expert_mode=True).check({"NCCL_GRAPH_FILE": graph})


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("NCCL_PROTO", "LL,LL128,Simple", "forces it on"),
        ("NCCL_PROTO", "LL128", "forces it on"),
        ("NCCL_PROTO", "^LL", "keeps LL128"),
        ("NCCL_PROTO", "allreduce:simple;broadcast:ll128", "forces it on"),
        ("NCCL_PROTO", "fast", "unknown protocol"),
        ("NCCL_P2P_LEVEL", "SYS", "P2P_LEVEL"),
        ("NCCL_NET_GDR_LEVEL", "PHB", "GDR_LEVEL"),
        ("NCCL_GRAPH_STREAM_ORDERING", "0", "ordering"),
        ("NCCL_MULTI_RANK_GPU_ENABLE", "1", "hang"),
        ("NCCL_IB_TIMEOUT", "0", "forever"),
        ("NCCL_IB_TIMEOUT", "40", "forever"),
        ("NCCL_COMM_ID", "10.0.0.1:1234", "rendezvous"),
        ("NCCL_SOCKET_NTHREADS", "16", "<= 64"),
    ],
)
def test_dangerous_knobs_are_refused_with_the_reason(policy: EnvPolicy, key: str, value: str, why: str) -> None:
    env = {key: value}
    if key == "NCCL_SOCKET_NTHREADS":
        env["NCCL_NSOCKS_PERTHREAD"] = "8"
    assert why in _refused(policy, env)[key]


def test_every_violation_is_reported_at_once(policy: EnvPolicy) -> None:
    with pytest.raises(EnvPolicyError) as info:
        policy.check({"LD_PRELOAD": "x", "NCCL_PROTO": "LL128", "NCCL_DEBUG": "INFO"})
    assert [v.key for v in info.value.violations] == ["LD_PRELOAD", "NCCL_PROTO"]
    assert "LD_PRELOAD" in str(info.value) and "NCCL_PROTO" in str(info.value)


def test_control_characters_in_values_are_refused(policy: EnvPolicy) -> None:
    assert "control" in _refused(policy, {"NCCL_DEBUG": "INFO\nLD_PRELOAD=x"})["NCCL_DEBUG"]
