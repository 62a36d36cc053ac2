"""cluster.yaml under hypothesis: any document or text either parses or raises ``ConfigError`` naming a
field path in the document; never another exception, never a path the document does not have."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topo_tune.config.cluster import ClusterConfig, loads_cluster_config, parse_cluster_config
from topo_tune.errors import ConfigError

EXAMPLE = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "cluster.yaml").read_text())
PATH = re.compile(
    r'^([A-Za-z_][A-Za-z0-9_-]*|\["(?:[^"\\]|\\.)*"\])(\[\d+\]|\.[A-Za-z_][A-Za-z0-9_-]*|\["(?:[^"\\]|\\.)*"\])*$'
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["10s", "-1s", "0s", "1e400s", "nan", "inf", "5m", "0.0.0.0:50051", "host:99999", "x" * 300]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12,
)


def paths(document: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``document`` (mapping keys and list indexes)."""
    found = [prefix] if prefix else []
    if isinstance(document, dict):
        for key, value in document.items():
            found += paths(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found += paths(value, (*prefix, index))
    return found


def dotted(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def check(document: object) -> ClusterConfig | ConfigError:
    try:
        return parse_cluster_config(document)
    except ConfigError as error:
        assert "\n" not in str(error), f"a multi-line error: {error}"
        return error


@FUZZ
@given(data=st.data())
def test_one_changed_value_is_accepted_or_named(data: st.DataObject) -> None:
    document = copy.deepcopy(EXAMPLE)
    path = data.draw(st.sampled_from(paths(document)))
    action = data.draw(st.sampled_from(["replace", "delete", "add-unknown"]))
    parent = document
    for part in path[:-1]:
        parent = parent[part]
    if action == "replace":
        parent[path[-1]] = data.draw(values)
    elif action == "delete":
        del parent[path[-1]]
    elif isinstance(parent[path[-1]], dict):
        parent[path[-1]]["notAKey"] = data.draw(values)
    outcome = check(document)
    if isinstance(outcome, ConfigError):
        # The rest of the document is the valid example, so the error is about the part that changed.
        assert outcome.field, f"no field named for a change at {dotted(path)}: {outcome}"
        assert PATH.match(outcome.field), f"not a field path: {outcome.field!r}"
        top = outcome.field.split(".")[0].split("[")[0]
        assert top == path[0], f"change at {dotted(path)} blamed on {outcome.field}: {outcome}"
    else:
        interval, expiry = outcome.controller.heartbeat_interval, outcome.controller.heartbeat_expiry
        assert math.isfinite(interval) and math.isfinite(expiry) and 0 < interval < expiry, (interval, expiry)
        for rack in outcome.racks:
            for node in rack.nodes:
                assert 0 <= node.gpus <= 1024


@FUZZ
@given(document=values)
def test_any_document_is_accepted_or_named(document: object) -> None:
    check(document)


@FUZZ
@given(text=st.one_of(st.text(max_size=200), st.builds(yaml.safe_dump, values)))
def test_any_text_is_accepted_or_named(text: str) -> None:
    try:
        loads_cluster_config(text)
    except ConfigError as error:
        assert "\n" not in str(error), f"a multi-line error: {error}"
