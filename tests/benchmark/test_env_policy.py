"""The agent is not a remote shell: an allow-list by name, each value of its type, every path confined."""

from __future__ import annotations

from pathlib import Path

import pytest

from topo_tune.benchmark.env_policy import OUTPUT_DIR, VARIABLES, EnvPolicy
from topo_tune.errors import EnvPolicyError

# One accepted value per allowed name, written from NCCL's and torch's docs, not from the table: a name
# dropped from (or renamed in) the allow-list fails here.
ACCEPTED = {
    "NCCL_MIN_CTAS": "1",
    "NCCL_MAX_CTAS": "64",
    "NCCL_MIN_NCHANNELS": "2",
    "NCCL_MAX_NCHANNELS": "32",
    "NCCL_MIN_P2P_NCHANNELS": "1",
    "NCCL_MAX_P2P_NCHANNELS": "64",
    "NCCL_NVLS_NCHANNELS": "16",
    "NCCL_NCHANNELS_PER_NET_PEER": "2",
    "NCCL_NTHREADS": "512",
    "NCCL_LL128_NTHREADS": "640",
    "NCCL_BUFFSIZE": "4194304",
    "NCCL_LL_BUFFSIZE": "1",
    "NCCL_LL128_BUFFSIZE": "1073741824",
    "NCCL_CHUNK_SIZE": "0",
    "NCCL_P2P_NET_CHUNKSIZE": "131072",
    "NCCL_P2P_NVL_CHUNKSIZE": "524288",
    "NCCL_P2P_PCI_CHUNKSIZE": "131072",
    "NCCL_NVLS_CHUNKSIZE": "131072",
    "NCCL_IB_QPS_PER_CONNECTION": "128",
    "NCCL_IB_SPLIT_DATA_ON_QPS": "1",
    "NCCL_CROSS_NIC": "2",
    "NCCL_SOCKET_NTHREADS": "4",
    "NCCL_NSOCKS_PERTHREAD": "16",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_PXN_DISABLE": "1",
    "NCCL_P2P_PXN_LEVEL": "2",
    "NCCL_ALGO": "allreduce:tree,ring;broadcast:^nvls",
    "NCCL_PROTO": "allreduce:^LL128;broadcast:LL,Simple",
    "NCCL_CTA_POLICY": "efficiency",
    "NCCL_NETDEVS_POLICY": "MAX:2",
    "NCCL_CUMEM_ENABLE": "1",
    "NCCL_CUMEM_HOST_ENABLE": "0",
    "NCCL_P2P_DISABLE": "0",
    "NCCL_SHM_DISABLE": "1",
    "NCCL_NET_GDR_READ": "1",
    "NCCL_NET_GDR_C2C": "0",
    "NCCL_P2P_LEVEL": "NVL",
    "NCCL_NET_GDR_LEVEL": "LOC",
    "NCCL_GRAPH_STREAM_ORDERING": "1",
    "NCCL_MULTI_RANK_GPU_ENABLE": "0",
    "NCCL_IB_TIMEOUT": "31",
    "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1",
    "NCCL_IB_GID_INDEX": "-1",
    "NCCL_IB_ADDR_FAMILY": "AF_INET6",
    "NCCL_IB_ADDR_RANGE": "10.0.0.0/8",
    "NCCL_IB_ROCE_VERSION_NUM": "2",
    "NCCL_IB_TC": "106",
    "NCCL_IB_SL": "15",
    "NCCL_IB_FIFO_TC": "255",
    "NCCL_IB_RETRY_CNT": "7",
    "NCCL_IB_PCI_RELAXED_ORDERING": "1",
    "NCCL_IB_ADAPTIVE_ROUTING": "1",
    "NCCL_IB_AR_THRESHOLD": "8192",
    "NCCL_IB_ECE_ENABLE": "0",
    "NCCL_IB_MERGE_NICS": "0",
    "NCCL_IB_MERGE_VFS": "1",
    "NCCL_IB_DISABLE": "1",
    "NCCL_SOCKET_IFNAME": "^docker,lo",
    "NCCL_SOCKET_FAMILY": "AF_INET",
    "NCCL_NET": "Socket",
    "NCCL_IGNORE_CPU_AFFINITY": "1",
    "NCCL_HOSTID": "node-17.rack3",
    "NCCL_TOPO_FILE": "{config}/topo.xml",
    "NCCL_GRAPH_FILE": "{config}/graph.xml",
    "NCCL_CONF_FILE": "{config}/versions/cv-0123456789abcdef/nccl.conf",
    "NCCL_TUNER_CONFIG_FILE": "{config}/nccl_tuner.conf",
    "NCCL_TUNER_PLUGIN": "{plugins}/libnccl-tuner-topotune.so",
    "NCCL_NET_PLUGIN": "none",
    "NCCL_PROFILER_PLUGIN": "NONE",
    "NCCL_ENV_PLUGIN": "{plugins}/libnccl-env.so",
    "NCCL_DEBUG": "info",
    "NCCL_DEBUG_SUBSYS": "INIT,GRAPH,TUNING",
    "NCCL_DEBUG_FILE": "nccl.%h.%p.log",
    "NCCL_TOPO_DUMP_FILE": "topo.xml",
    "NCCL_TOPO_DUMP_FILE_RANK": "3",
    "NCCL_GRAPH_DUMP_FILE": "graph.xml",
    "NCCL_GRAPH_DUMP_FILE_RANK": "0",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    "TORCH_NCCL_BLOCKING_WAIT": "0",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "86400",
    "TORCH_NCCL_ENABLE_MONITORING": "1",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "TORCH_NCCL_DESYNC_DEBUG": "1",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "65536",
    "TORCH_FR_BUFFER_SIZE": "0",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "frdump_",
    "TORCH_FR_DUMP_TEMP_FILE": "frdump_",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "frpipe_",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
OUTPUT_FILES = {
    "NCCL_DEBUG_FILE",
    "NCCL_TOPO_DUMP_FILE",
    "NCCL_GRAPH_DUMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
}


@pytest.fixture
def policy(tmp_path: Path) -> EnvPolicy:
    (tmp_path / "config").mkdir()
    (tmp_path / "plugins").mkdir()
    return EnvPolicy(config_dirs=(tmp_path / "config",), plugin_dirs=(tmp_path / "plugins",), expert_mode=True)


def _accepted(tmp_path: Path) -> dict[str, str]:
    return {k: v.format(config=tmp_path / "config", plugins=tmp_path / "plugins") for k, v in ACCEPTED.items()}


def _refused(policy: EnvPolicy, env: dict[str, str]) -> dict[str, str]:
    with pytest.raises(EnvPolicyError) as info:
        policy.check(env)
    return {v.key: v.reason for v in info.value.violations}


def test_the_allow_list_is_exactly_the_reviewed_names() -> None:
    assert set(VARIABLES) == set(ACCEPTED)


def test_every_allowed_name_takes_a_value_of_its_type(policy: EnvPolicy, tmp_path: Path) -> None:
    env = _accepted(tmp_path)
    for key, value in env.items():
        policy.check({key: value})  # each alone (the socket product counts the other as 1)
    policy.check({k: v for k, v in env.items() if k != "NCCL_NSOCKS_PERTHREAD"})


@pytest.mark.parametrize(
    "key", ["LD_PRELOAD", "LD_LIBRARY_PATH", "PATH", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "BASH_ENV"]
)
def test_loader_and_interpreter_variables_are_refused(policy: EnvPolicy, key: str) -> None:
    assert "loader/interpreter" in _refused(policy, {key: "/tmp/evil"})[key]


@pytest.mark.parametrize(
    "key",
    [
        "HOME",
        "GLOO_SOCKET_IFNAME",
        "MY_VAR",
        "OMP_NUM_THREADS",
        "NCCL_WHATEVER_NEW",
        "NCCL_RAS_ADDR",
        "NCCL_RAS_ADDR_FILE",
        "TORCH_NCCL_SOMETHING",
        "TORCH_NCCL_",
        "NCCL_",
        "NCCL_FOO_PLUGIN",
    ],
)
def test_names_not_on_the_allow_list_are_refused(policy: EnvPolicy, key: str) -> None:
    assert "allow-list" in _refused(policy, {key: "1"})[key]


def test_invalid_names_are_refused(policy: EnvPolicy) -> None:
    assert "valid variable name" in _refused(policy, {"nccl_debug": "INFO"})["nccl_debug"]
    assert "valid variable name" in _refused(policy, {"1NCCL": "1"})["1NCCL"]


def test_a_library_nccl_would_dlopen_is_refused_with_the_reason(policy: EnvPolicy) -> None:
    assert "dlopen" in _refused(policy, {"NCCL_IBVERBS_LIB": "/tmp/libevil.so"})["NCCL_IBVERBS_LIB"]


def test_gpu_placement_cannot_come_from_the_environment(policy: EnvPolicy) -> None:
    assert "rank map" in _refused(policy, {"CUDA_VISIBLE_DEVICES": "1"})["CUDA_VISIBLE_DEVICES"]


@pytest.mark.parametrize("key", ["NCCL_TUNER_PLUGIN", "NCCL_NET_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN"])
def test_plugins_outside_the_plugin_dirs_are_refused(policy: EnvPolicy, tmp_path: Path, key: str) -> None:
    assert "outside" in _refused(policy, {key: "/usr/lib/libevil.so"})[key]
    assert "absolute path" in _refused(policy, {key: "libevil.so"})[key]
    assert "absolute path" in _refused(policy, {key: ""})[key]
    # '..' and symlinks cannot climb out of the directory, nor a sibling whose name starts the same.
    assert "outside" in _refused(policy, {key: str(tmp_path / "plugins" / ".." / "evil.so")})[key]
    (tmp_path / "plugins-evil").mkdir()
    assert "outside" in _refused(policy, {key: str(tmp_path / "plugins-evil" / "x.so")})[key]
    link = tmp_path / "plugins" / "link.so"
    link.symlink_to("/usr/lib/libevil.so")
    assert "outside" in _refused(policy, {key: str(link)})[key]


@pytest.mark.parametrize("key", ["NCCL_TOPO_FILE", "NCCL_CONF_FILE", "NCCL_TUNER_CONFIG_FILE", "NCCL_GRAPH_FILE"])
def test_input_files_outside_the_config_dirs_are_refused(policy: EnvPolicy, tmp_path: Path, key: str) -> None:
    assert "outside" in _refused(policy, {key: "/etc/passwd"})[key]
    assert "outside" in _refused(policy, {key: f"{tmp_path}/config-evil/x"})[key]
    assert "absolute path" in _refused(policy, {key: "config/x"})[key]
    assert "none configured" in _refused(EnvPolicy(expert_mode=True), {key: "/etc/passwd"})[key]


def test_graph_file_needs_expert_mode(tmp_path: Path) -> None:
    graph = str(tmp_path / "config" / "graph.xml")
    plain = EnvPolicy(config_dirs=(tmp_path / "config",))
    assert "expert mode" in _refused(plain, {"NCCL_GRAPH_FILE": graph})["NCCL_GRAPH_FILE"]
    plain.check({"NCCL_TOPO_FILE": graph})  # the other input files need no expert mode


@pytest.mark.parametrize("key", sorted(OUTPUT_FILES))
@pytest.mark.parametrize(
    "value", ["/var/tmp/victim", "/etc/cron.d/x", "../x", "a/b", "..", ".hidden", "", "x" * 129, "a b"]
)
def test_output_files_must_be_bare_names(policy: EnvPolicy, key: str, value: str) -> None:
    assert "bare file name" in _refused(policy, {key: value})[key]


def test_output_files_are_rewritten_into_the_job_directory(tmp_path: Path) -> None:
    env = {k: ACCEPTED[k] for k in OUTPUT_FILES} | {"NCCL_DEBUG": "WARN", "NCCL_TOPO_DUMP_FILE_RANK": "1"}
    confined = EnvPolicy.confine(env, tmp_path / "job")
    for key in OUTPUT_FILES:
        assert confined[key] == str(tmp_path / "job" / OUTPUT_DIR / ACCEPTED[key])
    assert confined["NCCL_DEBUG"] == "WARN" and confined["NCCL_TOPO_DUMP_FILE_RANK"] == "1"
    assert env["NCCL_DEBUG_FILE"] == ACCEPTED["NCCL_DEBUG_FILE"]  # the caller's mapping is left alone


@pytest.mark.parametrize("value", ["/etc/nccl/topo-tune/active/nccl.conf", "../../x", "a/b", ".."])
def test_confine_refuses_what_it_cannot_confine(tmp_path: Path, value: str) -> None:
    with pytest.raises(EnvPolicyError) as info:
        EnvPolicy.confine({"NCCL_DEBUG_FILE": value, "NCCL_TOPO_DUMP_FILE": "ok.xml"}, tmp_path)
    assert [v.key for v in info.value.violations] == ["NCCL_DEBUG_FILE"]


def test_a_config_version_may_not_write_files(policy: EnvPolicy, tmp_path: Path) -> None:
    for key in OUTPUT_FILES:
        with pytest.raises(EnvPolicyError, match="every job write a file"):
            policy.check_config({key: ACCEPTED[key]})
    with pytest.raises(EnvPolicyError) as info:
        policy.check_config({"NCCL_DEBUG_FILE": "x.log", "NCCL_PROTO": "LL128", "NCCL_DEBUG": "WARN"})
    assert [v.key for v in info.value.violations] == ["NCCL_DEBUG_FILE", "NCCL_PROTO"]
    policy.check_config({"NCCL_DEBUG": "WARN", "NCCL_TOPO_FILE": str(tmp_path / "config" / "t.xml")})


def test_without_the_nodes_directories_paths_are_checked_for_form_only() -> None:
    unknown = EnvPolicy(node_paths=False)
    unknown.check({"NCCL_TOPO_FILE": "/etc/nccl/topo-tune/topo.xml", "NCCL_TUNER_PLUGIN": "/opt/x/lib.so"})
    refused = _refused(unknown, {"NCCL_TOPO_FILE": "/etc/nccl/../passwd", "NCCL_CONF_FILE": "rel/x"})
    assert "normalised" in refused["NCCL_TOPO_FILE"] and "absolute" in refused["NCCL_CONF_FILE"]


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("NCCL_PROTO", "LL,LL128,Simple", "forces it on"),
        ("NCCL_PROTO", "LL128", "forces it on"),
        ("NCCL_PROTO", "^LL", "keeps LL128"),
        ("NCCL_PROTO", "allreduce:simple;broadcast:ll128", "forces it on"),
        ("NCCL_PROTO", ";allreduce:LL128", "empty"),
        ("NCCL_PROTO", "^LL128;", "empty"),
        ("NCCL_PROTO", "fast", "unknown protocol"),
        ("NCCL_PROTO", "LL,", "unknown protocol"),
        ("NCCL_PROTO", "gather:LL", "unknown collective"),
        ("NCCL_ALGO", "Ring;", "look like"),
        ("NCCL_ALGO", "warp", "look like"),
        ("NCCL_P2P_LEVEL", "SYS", "P2P_LEVEL"),
        ("NCCL_P2P_LEVEL", "4", "P2P_LEVEL"),
        ("NCCL_NET_GDR_LEVEL", "PHB", "GDR_LEVEL"),
        ("NCCL_NET_GDR_LEVEL", "NVL", "GDR_LEVEL"),
        ("NCCL_GRAPH_STREAM_ORDERING", "0", "ordering"),
        ("NCCL_MULTI_RANK_GPU_ENABLE", "1", "hang"),
        ("NCCL_IB_TIMEOUT", "0", "forever"),
        ("NCCL_IB_TIMEOUT", "32", "forever"),
        ("NCCL_IB_TIMEOUT", "-1", "forever"),
        ("NCCL_COMM_ID", "10.0.0.1:1234", "rendezvous"),
        ("NCCL_MIN_CTAS", "0", "outside 1..64"),
        ("NCCL_MAX_CTAS", "65", "outside 1..64"),
        ("NCCL_NTHREADS", "96", "one of"),
        ("NCCL_BUFFSIZE", "1073741825", "outside"),
        ("NCCL_IB_SL", "16", "outside"),
        ("NCCL_IB_GID_INDEX", "-2", "outside"),
        ("NCCL_DEBUG", "LOUD", "one of"),
        ("NCCL_IB_HCA", "mlx5_0;rm -rf", "look like"),
        ("NCCL_SOCKET_IFNAME", "eth0 ", "look like"),
        ("NCCL_NETDEVS_POLICY", "MAX:0", "look like"),
    ],
)
def test_values_outside_their_type_are_refused_with_the_reason(
    policy: EnvPolicy, key: str, value: str, why: str
) -> None:
    assert why in _refused(policy, {key: value})[key]


@pytest.mark.parametrize("value", ["010", "0x10", "12abc", " 12", "12 ", "+12", "1_2", "1e3", "", "٣"])
def test_integers_are_decimal_as_written_so_nccl_reads_the_value_checked(policy: EnvPolicy, value: str) -> None:
    # strtoll(value, NULL, 0) reads 010 as 8, 0x10 as 16 and 12abc as 12: only plain decimals pass.
    assert "decimal integer" in _refused(policy, {"NCCL_MIN_CTAS": value})["NCCL_MIN_CTAS"]


@pytest.mark.parametrize(
    ("threads", "socks", "refused"),
    [
        ("16", "5", True),
        ("16", "4", False),
        ("8", "8", False),
        ("4", "17", True),
        (None, "65", True),
        ("16", None, False),
    ],
)
def test_the_socket_thread_product_is_bounded_also_when_one_is_set_alone(
    policy: EnvPolicy, threads: str | None, socks: str | None, refused: bool
) -> None:
    env = {k: v for k, v in (("NCCL_SOCKET_NTHREADS", threads), ("NCCL_NSOCKS_PERTHREAD", socks)) if v is not None}
    if not refused:
        policy.check(env)
        return
    assert any("<= 64" in r or "outside" in r for r in _refused(policy, env).values())


def test_the_socket_product_needs_both_decimal(policy: EnvPolicy) -> None:
    reasons = _refused(policy, {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "0x4"})
    assert "decimal" in reasons["NCCL_SOCKET_NTHREADS"] and "decimal" in reasons["NCCL_NSOCKS_PERTHREAD"]


def test_every_violation_is_reported_at_once(policy: EnvPolicy) -> None:
    with pytest.raises(EnvPolicyError) as info:
        policy.check({"LD_PRELOAD": "x", "NCCL_PROTO": "LL128", "NCCL_DEBUG": "INFO"})
    assert [v.key for v in info.value.violations] == ["LD_PRELOAD", "NCCL_PROTO"]
    assert str(info.value) == (
        "benchmark env refused: LD_PRELOAD: loader/interpreter variables are never accepted (they load or run "
        "code); NCCL_PROTO: listing LL128 in NCCL_PROTO forces it on, bypassing NCCL's safety checks (data "
        "corruption)"
    )


@pytest.mark.parametrize("char", ["\n", "\r", "\x0b", "\x1c", "\x1f", "\x7f", "\x85", "\x9f", "\x00"])
def test_control_characters_in_values_are_refused(policy: EnvPolicy, char: str) -> None:
    assert "control" in _refused(policy, {"NCCL_DEBUG": f"INFO{char}"})["NCCL_DEBUG"]


def test_values_longer_than_nccl_keeps_are_refused(policy: EnvPolicy, tmp_path: Path) -> None:
    root = str(tmp_path / "config") + "/"
    policy.check({"NCCL_TOPO_FILE": root + "x" * (1023 - len(root))})
    assert "longer than 1023" in _refused(policy, {"NCCL_TOPO_FILE": root + "x" * (1024 - len(root))})["NCCL_TOPO_FILE"]


@pytest.mark.parametrize(
    ("env", "reasons"),
    [
        ({"nccl_x": "1"}, {"nccl_x": "not a valid variable name (upper-case letters, digits and '_')"}),
        ({"NCCL_DEBUG": "WARN\x7f"}, {"NCCL_DEBUG": "the value contains control characters"}),
        ({"NCCL_NET": "IB\xa0"}, {"NCCL_NET": "must look like IB or Socket (a network plugin's name)"}),
        (
            {"NVIDIA_VISIBLE_DEVICES": "0"},
            {"NVIDIA_VISIBLE_DEVICES": "GPU placement comes from the job's rank map, not from the environment"},
        ),
        (
            {"NCCL_NEW": "1"},
            {"NCCL_NEW": "not allow-listed: not an NCCL/torch variable topo-tune knows (docs/security.md lists them)"},
        ),
        ({"NCCL_MIN_CTAS": "65"}, {"NCCL_MIN_CTAS": "65 is outside 1..64"}),
        ({"NCCL_IB_TIMEOUT": "32"}, {"NCCL_IB_TIMEOUT": "32 is outside 1..31 (0 or >= 32 waits forever)"}),
        ({"NCCL_MIN_CTAS": "x"}, {"NCCL_MIN_CTAS": "must be a decimal integer in 1..64"}),
        ({"NCCL_CTA_POLICY": "fast"}, {"NCCL_CTA_POLICY": "must be one of DEFAULT, EFFICIENCY, ZERO"}),
        (
            {"NCCL_P2P_LEVEL": "SYS"},
            {
                "NCCL_P2P_LEVEL": "must be one of 0, LOC, NVL "
                "(raising NCCL_P2P_LEVEL beyond NCCL's choice can hang or corrupt data)"
            },
        ),
        ({"NCCL_PROTO": "LL;"}, {"NCCL_PROTO": "an empty NCCL_PROTO segment"}),
        (
            {"NCCL_PROTO": "^LL"},
            {"NCCL_PROTO": "an NCCL_PROTO exclusion list that keeps LL128 forces LL128 on, which can corrupt data"},
        ),
        (
            {"NCCL_PROTO": "LL,LL128"},
            {
                "NCCL_PROTO": "listing LL128 in NCCL_PROTO forces it on, "
                "bypassing NCCL's safety checks (data corruption)"
            },
        ),
        ({"NCCL_PROTO": "gather:LL"}, {"NCCL_PROTO": "unknown collective 'gather' in NCCL_PROTO"}),
        ({"NCCL_PROTO": "LL,fast"}, {"NCCL_PROTO": "unknown protocol(s) ['FAST']"}),
        (
            {"NCCL_TUNER_PLUGIN": "lib.so"},
            {"NCCL_TUNER_PLUGIN": "must be an absolute path inside the agent's plugin directories"},
        ),
        (
            {"NCCL_TOPO_FILE": "t.xml"},
            {"NCCL_TOPO_FILE": "must be an absolute path inside the agent's config directories"},
        ),
        (
            {"NCCL_DEBUG_FILE": "a/b"},
            {
                "NCCL_DEBUG_FILE": "give a bare file name (letters, digits, '.', '_', '-', '%'); "
                "the agent writes it into the job's own directory"
            },
        ),
        (
            {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "0x4"},
            {
                "NCCL_SOCKET_NTHREADS": "NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD must both be decimal integers",
                "NCCL_NSOCKS_PERTHREAD": "must be a decimal integer in 1..64",
            },
        ),
        (
            {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "17"},
            dict.fromkeys(
                ("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"),
                "NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD must be <= 64",
            ),
        ),
        ({"NCCL_SOCKET_NTHREADS": "17"}, {"NCCL_SOCKET_NTHREADS": "17 is outside 1..16"}),
        ({"NCCL_SOCKET_NTHREADS": "16", "NCCL_DEBUG": "WARN"}, {}),
    ],
)
def test_each_refusal_says_exactly_why(policy: EnvPolicy, env: dict[str, str], reasons: dict[str, str]) -> None:
    if not reasons:
        policy.check(env)
        return
    assert _refused(policy, env) == reasons


def test_a_path_outside_names_the_directories(tmp_path: Path) -> None:
    two = EnvPolicy(config_dirs=(tmp_path / "a", tmp_path / "b"))
    assert _refused(two, {"NCCL_TOPO_FILE": "/etc/x"}) == {
        "NCCL_TOPO_FILE": f"'/etc/x' is outside the agent's config directories ({tmp_path / 'a'}, {tmp_path / 'b'})"
    }
    assert _refused(EnvPolicy(), {"NCCL_NET_PLUGIN": "/x.so"}) == {
        "NCCL_NET_PLUGIN": "'/x.so' is outside the agent's plugin directories (none configured)"
    }


def test_a_config_version_checks_the_socket_product_across_its_settings(policy: EnvPolicy) -> None:
    with pytest.raises(EnvPolicyError) as info:
        policy.check_config({"NCCL_SOCKET_NTHREADS": "16", "NCCL_NSOCKS_PERTHREAD": "8"})
    assert {v.key for v in info.value.violations} == {"NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"}
    with pytest.raises(EnvPolicyError) as info:
        policy.check_config({"NCCL_DEBUG_FILE": "x.log"})
    assert (
        str(info.value)
        == "benchmark env refused: NCCL_DEBUG_FILE: a config version may not make every job write a file"
    )


def test_confine_reports_every_name_it_cannot_confine(tmp_path: Path) -> None:
    with pytest.raises(EnvPolicyError) as info:
        EnvPolicy.confine({"NCCL_DEBUG_FILE": "/a", "NCCL_TOPO_DUMP_FILE": "../b", "NCCL_DEBUG": "WARN"}, tmp_path)
    assert str(info.value) == (
        "benchmark env refused: NCCL_DEBUG_FILE: not a bare file name; refusing to write it; "
        "NCCL_TOPO_DUMP_FILE: not a bare file name; refusing to write it"
    )
