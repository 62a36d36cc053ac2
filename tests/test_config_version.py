"""Config versions: content addressing, allowed files, and nccl.conf exactly as NCCL reads it."""

from __future__ import annotations

import pytest

from topo_tune.config_version import ConfigVersion, is_version_id, parse_nccl_conf, render_nccl_conf, version_id
from topo_tune.errors import ValidationError


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
