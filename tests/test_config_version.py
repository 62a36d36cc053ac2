"""Config versions: content addressing, allowed files, and nccl.conf exactly as NCCL reads it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from topo_tune.errors import ValidationError
from topo_tune.topology.distance import node_pair_matrix
from topo_tune.tuner.ring.rank_map import plan_rank_map
from topo_tune.versions.version import (
    SYSTEM_NCCL_CONF,
    ConfigVersion,
    check_settings,
    file_settings,
    is_version_id,
    parse_nccl_conf,
    render_nccl_conf,
    version_id,
)


def test_id_depends_on_content_only() -> None:
    a = ConfigVersion({"nccl.conf": "NCCL_MIN_CTAS=16\n"}, provenance={"study": "s1"})
    b = ConfigVersion({"nccl.conf": "NCCL_MIN_CTAS=16\n"}, provenance={"study": "s2"})
    c = ConfigVersion({"nccl.conf": "NCCL_MIN_CTAS=32\n"})
    assert a.id == b.id != c.id
    assert is_version_id(a.id)
    assert version_id({"a": "1", "b": "2"}) == version_id({"b": "2", "a": "1"})


def test_versions_are_immutable() -> None:
    version = ConfigVersion({"nccl.conf": "NCCL_MIN_CTAS=16\n"})
    with pytest.raises(TypeError):
        version.files["nccl.conf"] = "NCCL_MIN_CTAS=1\n"  # type: ignore[index]


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"../etc/passwd": "x"}, "not a config file name"),
        ({"nccl.conf.bak": "x"}, "not a config file name"),
        ({"nccl.conf": "NCCL_A=1\nNCCL_A=2\n"}, "nccl.conf:2: NCCL_A set twice"),
        ({"nccl.conf": "export NCCL_A=1\n"}, "is not an NCCL variable name"),
        ({"nccl.conf": "just words\n"}, "no '='"),
        ({"rankmap.json": "\x00"}, "NUL"),
    ],
)
def test_bad_files_are_refused(files: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ConfigVersion(files)


def test_render_round_trips_through_nccls_rules() -> None:
    settings = {"NCCL_MIN_CTAS": "16", "NCCL_SOCKET_IFNAME": "=ens1f0", "NCCL_IB_HCA": "^mlx5_1:1"}
    text = render_nccl_conf(settings, header="topo-tune cv-0123\nsecond line")
    assert text.startswith("# topo-tune cv-0123\n# second line\n")
    assert parse_nccl_conf(text, strict=True) == settings


@pytest.mark.parametrize("value", [" 16", "16 ", "", "a\nNCCL_PROTO=LL128"])
def test_values_nccl_would_misread_are_refused(value: str) -> None:
    with pytest.raises(ValidationError):
        render_nccl_conf({"NCCL_MIN_CTAS": value})


def test_parse_follows_nccl_reading_rules() -> None:
    text = "# comment\n #not a comment=1\nNCCL_A=x = y \nNCCL_A=second\nnoequals\n"
    assert parse_nccl_conf(text) == {" #not a comment": "1", "NCCL_A": "x = y "}


def test_a_fixed_version_keeps_its_id() -> None:
    # Golden: the id is the content address nodes, pins and stored results use; a change to the hashing
    # (encoding, order, separators, digest length) would orphan every version already rolled out.
    files = {"nccl.conf": "NCCL_MIN_CTAS=16\nNCCL_PROTO=^LL128\n", "rankmap.json": '{"order": ["n1", "n0"]}\n'}
    # Worked out apart from the code: printf '%s' '[["nccl.conf","NCCL_DEBUG=WARN\n"]]' | sha256sum
    assert version_id(files) == "cv-6324e7a9ed34f372"
    assert version_id({}) == "cv-4f53cda18c2baa0c"
    assert version_id({"nccl.conf": "NCCL_DEBUG=WARN\n"}) == "cv-16c1939bfd28ea7d"
    assert version_id({"nccl.conf": "# n\u00f6de\n"}) == "cv-4213b13e5a61dfcb"  # UTF-8, not \\u escapes


@pytest.mark.parametrize("value", ["cv-0123456789abcdef", "cv-ffffffffffffffff"])
def test_version_ids_are_recognised(value: str) -> None:
    assert is_version_id(value)


@pytest.mark.parametrize(
    "value", ["cv-0123456789abcde", "cv-0123456789abcdef0", "cv-0123456789ABCDEF", "xcv-0123456789abcdef", "", "cv-"]
)
def test_other_strings_are_not_version_ids(value: str) -> None:
    assert not is_version_id(value)


# NCCL's reading rules (src/misc/param.cc, setEnvFile): fgets into char line[4096]; strip one '\n' then one
# '\r'; '#' at column 0 is a comment; a line without '=' is skipped; key and value cut at 1023 bytes;
# setenv(key, value, 0) so the first value wins.
@pytest.mark.parametrize(
    ("text", "settings"),
    [
        # Only '\n' ends a line: what str.splitlines() also breaks on stays inside the value.
        ("NCCL_DEBUG=WARN\x0bNCCL_PROTO=LL128\n", {"NCCL_DEBUG": "WARN\x0bNCCL_PROTO=LL128"}),
        ("NCCL_DEBUG=WARN\x1cNCCL_PROTO=LL128", {"NCCL_DEBUG": "WARN\x1cNCCL_PROTO=LL128"}),
        ("NCCL_DEBUG=WARN\x85NCCL_PROTO=LL128", {"NCCL_DEBUG": "WARN\x85NCCL_PROTO=LL128"}),
        ("NCCL_DEBUG=WARN\u2028NCCL_PROTO=LL128", {"NCCL_DEBUG": "WARN\u2028NCCL_PROTO=LL128"}),
        ("NCCL_DEBUG=WARN\rNCCL_PROTO=LL128\n", {"NCCL_DEBUG": "WARN\rNCCL_PROTO=LL128"}),
        # One trailing '\r' goes (NCCL 2.30), a second stays.
        ("NCCL_DEBUG=WARN\r\n", {"NCCL_DEBUG": "WARN"}),
        ("NCCL_DEBUG=WARN\r\r\n", {"NCCL_DEBUG": "WARN\r"}),
        ("NCCL_DEBUG=WARN", {"NCCL_DEBUG": "WARN"}),
        # A comment only at column 0; '=' inside the value is kept; no trimming.
        ("#NCCL_DEBUG=INFO\n #x=1\nNCCL_A==b \n", {" #x": "1", "NCCL_A": "=b "}),
        ("noequals\n\n=empty-key\nNCCL_A=\n", {"NCCL_A": ""}),
        ("NCCL_A=1\nNCCL_A=2\n", {"NCCL_A": "1"}),
        # A NUL ends the C string.
        ("NCCL_A=ab\x00NCCL_B=1\nNCCL_C=2\n", {"NCCL_A": "ab", "NCCL_C": "2"}),
        # Keys and values are cut at 1023 bytes.
        ("NCCL_A=" + "v" * 1030 + "\n", {"NCCL_A": "v" * 1023}),
        ("K" * 1030 + "=1\n", {"K" * 1023: "1"}),
        # A line of 4095 bytes or more is read in pieces, each a line of its own.
        ("#" + "c" * 4094 + "NCCL_PROTO=LL128\n", {"NCCL_PROTO": "LL128"}),
        ("#" + "c" * 4093 + "\nNCCL_A=1\n", {"NCCL_A": "1"}),
        ("#" + "c" * 4094 + "\nNCCL_A=1\n", {"NCCL_A": "1"}),
    ],
)
def test_parse_reads_what_nccl_reads(text: str, settings: dict[str, str]) -> None:
    assert parse_nccl_conf(text) == settings


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("NCCL_DEBUG=WARN\x0bNCCL_PROTO=LL128\n", "control characters"),
        ("NCCL_DEBUG=WARN\u2028NCCL_PROTO=LL128\n", "must be one of"),
        ("NCCL_DEBUG=WARN\r\n", "carriage return"),
        ("NCCL_DEBUG=WARN\rNCCL_PROTO=LL128\n", "carriage return"),
        ("#" + "c" * 4094 + "NCCL_PROTO=LL128\n", "nccl.conf:1: 4095 bytes or more"),
        ("NCCL_TOPO_FILE=/" + "v" * 1023 + "\n", "longer than NCCL's 1023 bytes"),
        ("NCCL_DEBUG=\n", "must be one of"),
        ("NCCL_IBVERBS_LIB=/tmp/x.so\n", "dlopen"),
        ("NCCL_WHATEVER=1\n", "allow-list"),
        ("TORCH_NCCL_BLOCKING_WAIT=1\n", "only NCCL_"),
        ("NCCL_TOPO_FILE=relative.xml\n", "absolute path"),
        ("NCCL_TOPO_FILE=/etc/nccl/../../tmp/x.xml\n", "normalised"),
    ],
)
def test_a_version_nccl_would_read_otherwise_or_the_policy_refuses_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        ConfigVersion({"nccl.conf": text})


def test_a_version_may_name_a_site_file_by_absolute_path() -> None:
    ConfigVersion({"nccl.conf": "NCCL_TOPO_FILE=/etc/nccl/topo-tune/site.xml\nNCCL_DEBUG=WARN\n"})


@pytest.mark.parametrize("value", ["a\x00b", "a\rb", "v" * 1024])
def test_render_refuses_what_would_not_read_back(value: str) -> None:
    with pytest.raises(ValidationError):
        render_nccl_conf({"NCCL_HOSTID": value})


def test_render_keeps_a_header_with_line_breaks_commented() -> None:
    text = render_nccl_conf({"NCCL_DEBUG": "WARN"}, header="a\x0bNCCL_PROTO=LL128\u2028NCCL_B=1")
    assert parse_nccl_conf(text, strict=True) == {"NCCL_DEBUG": "WARN"}


def test_file_settings_are_what_nccl_adds_from_its_files(tmp_path: Path) -> None:
    system = tmp_path / "etc-nccl.conf"
    system.write_text("NCCL_DEBUG=INFO\nNCCL_IB_HCA=mlx5_0\nNCCL_TOPO_FILE=/etc/t.xml\n")
    user = tmp_path / "job.conf"
    user.write_text("NCCL_IB_HCA=mlx5_1\nNCCL_MIN_CTAS=4\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".nccl.conf").write_text("NCCL_MAX_CTAS=8\n")
    env = {"NCCL_DEBUG": "WARN", "NCCL_CONF_FILE": str(user), "HOME": str(home)}
    # NCCL_CONF_FILE does not keep /etc/nccl.conf out; the environment wins, then the first file.
    assert file_settings(env, system_conf=system) == {
        "NCCL_IB_HCA": "mlx5_1",
        "NCCL_MIN_CTAS": "4",
        "NCCL_TOPO_FILE": "/etc/t.xml",
    }
    # Without NCCL_CONF_FILE (or with it empty) NCCL reads ~/.nccl.conf instead.
    for without in ({"HOME": str(home)}, {"HOME": str(home), "NCCL_CONF_FILE": ""}):
        assert file_settings(without, system_conf=system)["NCCL_MAX_CTAS"] == "8"
    assert file_settings({}, system_conf=tmp_path / "absent") == {}


def test_a_version_keeps_its_provenance_read_only_and_its_settings() -> None:
    version = ConfigVersion({"nccl.conf": "NCCL_MIN_CTAS=16\n"}, provenance={"study": "s1"})
    assert dict(version.provenance) == {"study": "s1"}
    with pytest.raises(TypeError):
        version.provenance["study"] = "s2"  # type: ignore[index]
    assert version.settings() == {"NCCL_MIN_CTAS": "16"}
    assert ConfigVersion({"nccl_tuner.conf": ""}).settings() == {}


@pytest.mark.parametrize(
    ("files", "field", "reason"),
    [
        (
            {"x.conf": "1"},
            "files['x.conf']",
            "not a config file name; allowed: nccl.conf, nccl_tuner.conf, rankmap.json, topology.xml, "
            "nccl_tuner.challenger-N.conf (N 1 to 4)",
        ),
        ({"topology.xml": "x" * ((1 << 20) + 1)}, "files['topology.xml']", "larger than 1048576 bytes"),
        ({"rankmap.json": "a\x00"}, "files['rankmap.json']", "contains a NUL byte"),
        ({"nccl.conf": "TORCH_X=1\n"}, "nccl.conf:TORCH_X", "only NCCL_* variables belong in nccl.conf"),
        ({"nccl.conf": "NCCL_IB_SL=16\n"}, "nccl.conf:NCCL_IB_SL", "16 is outside 0..15"),
        (
            {"nccl.conf": "NCCL_DEBUG=WARN\r\n"},
            "nccl.conf",
            "contains a carriage return (NCCL before 2.30 keeps it in the value)",
        ),
        ({"nccl.conf": "NCCL_DEBUG=WARN\nwords\n"}, "nccl.conf:2", "no '=' (NCCL ignores such a line)"),
        ({"nccl.conf": "\nNCCL_A=" + "v" * 1024 + "\n"}, "nccl.conf:2", "a key or value longer than NCCL's 1023 bytes"),
        ({"nccl.conf": "nccl_a=1\n"}, "nccl.conf:1", "'nccl_a' is not an NCCL variable name"),
    ],
)
def test_a_refused_version_names_the_field_and_the_reason(files: dict[str, str], field: str, reason: str) -> None:
    with pytest.raises(ValidationError) as info:
        ConfigVersion(files)
    assert (info.value.field, info.value.reason) == (field, reason)


def test_the_size_and_length_limits_are_inclusive() -> None:
    ConfigVersion({"topology.xml": "x" * (1 << 20)})
    assert parse_nccl_conf("NCCL_A=" + "v" * 1023 + "\n", strict=True) == {"NCCL_A": "v" * 1023}
    assert render_nccl_conf({"NCCL_HOSTID": "v" * 1023}) == "NCCL_HOSTID=" + "v" * 1023 + "\n"


@pytest.mark.parametrize(
    ("settings", "field", "reason"),
    [
        ({"nccl_a": "1"}, "nccl_a", "not an NCCL variable name"),
        ({"NCCL_A": " 1"}, "NCCL_A", "value ' 1' would not read back the same (empty, spaces or newline)"),
        ({"NCCL_A": "1\x00"}, "NCCL_A", "value '1\\x00' would not read back the same (empty, spaces or newline)"),
        ({"NCCL_A": "v" * 1024}, "NCCL_A", "value longer than NCCL's 1023 bytes"),
    ],
)
def test_render_names_the_key_and_the_reason(settings: dict[str, str], field: str, reason: str) -> None:
    with pytest.raises(ValidationError) as info:
        render_nccl_conf(settings)
    assert (info.value.field, info.value.reason) == (field, reason)


def test_render_accepts_any_other_printable_value() -> None:
    assert render_nccl_conf({"NCCL_HOSTID": "XX"}) == "NCCL_HOSTID=XX\n"


def test_check_settings_on_a_node_checks_paths_against_its_config_dir(tmp_path: Path) -> None:
    check_settings({"NCCL_TOPO_FILE": str(tmp_path / "t.xml")}, config_dir=tmp_path)
    with pytest.raises(ValidationError) as info:
        check_settings({"NCCL_TOPO_FILE": "/etc/nccl/topo-tune/t.xml"}, config_dir=tmp_path)
    assert info.value.field == "nccl.conf:NCCL_TOPO_FILE" and "outside the agent's config directories" in str(
        info.value
    )
    check_settings({"NCCL_TOPO_FILE": "/etc/nccl/topo-tune/t.xml"})  # the controller: form only


def test_bytes_that_are_not_utf8_are_read_as_nccl_reads_them(tmp_path: Path) -> None:
    system = tmp_path / "nccl.conf"
    system.write_bytes(b"NCCL_HOSTID=h\xff\nNCCL_\xfe=1\n")
    assert file_settings({}, system_conf=system) == {"NCCL_HOSTID": "h\udcff", "NCCL_\udcfe": "1"}
    # A cut at 1023 bytes may split a character; the bytes NCCL keeps are kept.
    assert parse_nccl_conf("NCCL_A=" + "é" * 600) == {"NCCL_A": "é" * 511 + "\udcc3"}
    assert parse_nccl_conf("NCCL_A=ab\x00x\x00y\n") == {"NCCL_A": "ab"}


def test_etc_nccl_conf_is_read_whatever_happened_to_the_first_file(tmp_path: Path) -> None:
    system = tmp_path / "nccl.conf"
    system.write_text("NCCL_IB_HCA=mlx5_0\n")
    assert file_settings({}, system_conf=system) == {"NCCL_IB_HCA": "mlx5_0"}  # no HOME, no NCCL_CONF_FILE
    missing = {"NCCL_CONF_FILE": str(tmp_path / "missing.conf")}
    assert file_settings(missing, system_conf=system) == {"NCCL_IB_HCA": "mlx5_0"}


def test_the_system_file_is_the_one_nccl_reads() -> None:
    assert Path("/etc/nccl.conf") == SYSTEM_NCCL_CONF  # src/misc/param.cc: initEnvFunc


def _rank_map(**changes: object) -> str:
    rank_map: dict[str, object] = {
        "version": 1,
        "planned": {"node_order": ["n1", "n0"], "ring_bottleneck_gbps": 12.5, "ring_latency_us": 3.0},
        "ranks": [{"rank": 0, "node": "n1", "local_rank": 0}, {"rank": 1, "node": "n0", "local_rank": 0}],
    }
    rank_map.update(changes)
    return json.dumps(rank_map)


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("[" * 100_000 + "]" * 100_000, "files['rankmap.json']", "nested more than 8 levels deep; not a rank map"),
        ('{"a": ' * 9 + "1" + "}" * 9, "files['rankmap.json']", "nested more than 8 levels deep; not a rank map"),
        ("{not json", "files['rankmap.json']", "not JSON: Expecting property name enclosed in double quotes"),
        ("[]", "files['rankmap.json']", "a rank map is a JSON object, not list"),
        (
            _rank_map(order=["n1"]),
            "rankmap.json:order",
            "not a rank map key; known: method, naive, pair_matrix, pairs, planned",
        ),
        (_rank_map(version=2), "rankmap.json:version", "must be 1, got 2"),
        (_rank_map(planned=None), "rankmap.json:planned", "required: an object with node_order"),
        (_rank_map(planned={"node_order": "n1"}), "rankmap.json:planned.node_order", "required: a list of node"),
        (_rank_map(naive={"node_order": ["a", "a"]}), "rankmap.json:naive.node_order", "names a node twice"),
        (_rank_map(ranks=[{"rank": "0", "node": "n1"}]), "rankmap.json:ranks", "a list of {rank, node, local_rank}"),
    ],
    ids=["deep", "nine-levels", "not-json", "list", "key", "version", "planned", "order", "twice", "ranks"],
)
def test_a_rank_map_is_checked_for_depth_and_shape_before_anything_stores_it(
    text: str, field: str, reason: str
) -> None:
    with pytest.raises(ValidationError) as info:
        ConfigVersion({"rankmap.json": text})
    assert info.value.field == field and info.value.reason.startswith(reason), str(info.value)


def test_brackets_inside_strings_are_no_nesting_and_the_tuner_s_rank_maps_pass() -> None:
    ConfigVersion({"rankmap.json": _rank_map(method='[[[[[[[[[[ {{{{{{{{{{ \\ " ]]]]')})
    names, rack_of = ["a1", "b1", "a2", "b2"], {"a1": "a", "a2": "a", "b1": "b", "b2": "b"}
    pairs = node_pair_matrix(names, injection_gbps=dict.fromkeys(names, 400.0), rack_of=rack_of)
    written = plan_rank_map(pairs, slots=8, rack_of=rack_of).to_json()
    assert '"edges"' in written and '"pairs"' in written
    ConfigVersion({"rankmap.json": written})
