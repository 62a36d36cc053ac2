"""Fixtures for the namespace-cluster scenarios: a factory that builds clusters and always tears them down.

Without the right to create namespaces these tests fail with the reason (CI runs as root): a skipped
scenario would hide exactly what they exist to show.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.netns import ClusterShape, NamespacesUnavailable, NetnsCluster, check_namespaces_allowed

ClusterFactory = Callable[..., NetnsCluster]


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[ClusterFactory]:
    """``make_cluster(shape, **options)`` → a built ``NetnsCluster``; every one is closed after the test,
    and a failed test shows its daemons' logs."""
    try:
        check_namespaces_allowed()
    except NamespacesUnavailable as error:
        pytest.fail(str(error), pytrace=False)
    built: list[NetnsCluster] = []

    def make(shape: ClusterShape, **options: object) -> NetnsCluster:
        cluster = NetnsCluster(shape, tmp_path / f"cluster-{len(built)}", **options)  # type: ignore[arg-type]
        built.append(cluster)
        cluster.build()
        return cluster

    try:
        yield make
    finally:
        for cluster in built:
            print(cluster.logs())  # pytest shows it only when the test failed
            cluster.close()
