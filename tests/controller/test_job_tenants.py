"""Job credentials per tenant, at a real controller over gRPC on loopback: each issued one is distinct and
revoked alone, acts for its scope's job ids only, and owns the pins and comparisons it made; what one job
credential may store is capped, refused before anything is written."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from tests.conftest import controller_settings
from tests.controller.test_job_comparisons import _request
from tests.support.processes import TOKEN, cli_env, run_cli
from topo_tune.client.admin import AdminClient
from topo_tune.client.credential_entries import IssuedRole, IssuedToken
from topo_tune.config.cluster import JobCapsConfig
from topo_tune.controller.server import Controller
from topo_tune.errors import PermissionDenied, QuotaExceeded
from topo_tune.jobs.compare.comparison_record import StoredComparison
from topo_tune.jobs.compare.schedule import Arm
from topo_tune.tuner.statistics import Decision

JOB = "train-77"  # the job of test_job_comparisons' requests


def _issue(controller: Controller, scope: str = "") -> IssuedToken:
    with AdminClient(f"127.0.0.1:{controller.port}", token=TOKEN) as admin:
        return admin.issue_credential(IssuedRole.JOB, scope=scope)


def _client(controller: Controller, token: str) -> AdminClient:
    return AdminClient(f"127.0.0.1:{controller.port}", token=token)


@pytest.fixture
async def capped(sqlite_url: str) -> AsyncIterator[Controller]:
    """A controller whose job credentials may hold three pins and one comparison, of 64 bytes of node names."""
    caps = JobCapsConfig(pins_per_credential=3, comparisons_per_credential=1, row_node_bytes=64)
    server = Controller(controller_settings(sqlite_url, job_caps=caps))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_each_job_credential_is_its_own_listed_and_revoked_alone(controller: Controller) -> None:
    env = cli_env(TOPO_TUNE_CONTROLLER=f"127.0.0.1:{controller.port}")
    first = await asyncio.to_thread(run_cli, "admin", "credential", "issue", "--job", "-o", "json", env=env)
    args = ("admin", "credential", "issue", "--job", "--scope", "team-b-", "-o", "json")
    second = await asyncio.to_thread(run_cli, *args, env=env)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["token"] != b["token"] and a["id"] != b["id"] and b["scope"] == "team-b-"
    listed = await asyncio.to_thread(run_cli, "admin", "credential", "list", "-o", "json", env=env)
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    assert rows[b["id"]]["scope"] == "team-b-" and rows[a["id"]]["scope"] == ""
    agent = await asyncio.to_thread(run_cli, "admin", "credential", "issue", "--node", "n4", env=env)
    assert agent.returncode == 0, agent.stderr

    revoked = await asyncio.to_thread(run_cli, "admin", "credential", "revoke", b["id"], env=env)
    assert revoked.returncode == 0, revoked.stderr

    def calls() -> None:
        revoked = pytest.raises(PermissionDenied, match=f"credential {b['id']} was revoked")
        with _client(controller, b["token"]) as tenant_b, revoked:
            tenant_b.resolve_job_config("team-b-1", ["n1", "n2"])
        with _client(controller, a["token"]) as tenant_a:  # the other tenant's goes on
            assert tenant_a.resolve_job_config("j1", ["n1", "n2"]).job_id == "j1"
        with AdminClient(f"127.0.0.1:{controller.port}", token=TOKEN) as admin:  # so do the admin's
            assert admin.resolve_job_config("j2", ["n1"]).job_id == "j2"

    await asyncio.to_thread(calls)
    # The agent credential issued before the revocation is untouched: it is still valid and unrevoked.
    assert controller.credentials.identify(agent.stdout.strip().encode()) is not None
    again = await asyncio.to_thread(run_cli, "admin", "credential", "issue", "--job", "--scope", "team-b-", env=env)
    assert again.returncode == 0 and again.stdout.strip() != b["token"], "a new one without a new admin token"


async def test_a_job_credential_neither_reads_nor_extends_another_tenants_pin(controller: Controller) -> None:
    a, b = await asyncio.to_thread(_issue, controller), await asyncio.to_thread(_issue, controller)

    def attempts() -> list[str]:
        with _client(controller, a.token) as tenant_a:
            tenant_a.resolve_job_config("victim-1", ["gpu-a1", "gpu-a2"])
        refused = []
        with _client(controller, b.token) as tenant_b:
            for arm in ("", "stable", "cv-0123456789abcdef"):
                with pytest.raises(PermissionDenied) as caught:
                    tenant_b.resolve_job_config("victim-1", ["gpu-a1"], arm=arm)
                refused.append(str(caught.value).partition(" refused: ")[2])
        with _client(controller, a.token) as tenant_a:  # the owner still gets its own pin
            assert list(tenant_a.resolve_job_config("victim-1", ["gpu-a1", "gpu-a2"]).node_order) == [
                "gpu-a1",
                "gpu-a2",
            ]
        return refused

    refused = await asyncio.to_thread(attempts)
    assert set(refused) == {"job 'victim-1' belongs to another credential"}, "nothing of the pin is echoed"
    assert await controller.rollout_store.get_pin("victim-1", arm="stable") is None, "no arm pinned by the other"


async def test_a_scoped_job_credential_cannot_pin_a_job_outside_its_scope(controller: Controller) -> None:
    b = await asyncio.to_thread(_issue, controller, "team-b-")

    def attempt() -> str:
        with _client(controller, b.token) as tenant_b:
            assert tenant_b.resolve_job_config("team-b-5", ["n1"]).job_id == "team-b-5"
            with pytest.raises(PermissionDenied) as caught:
                tenant_b.resolve_job_config("team-a-9", ["ghost-a", "ghost-b", "ghost-c", "n1"])
        return str(caught.value).partition(" refused: ")[2]

    message = await asyncio.to_thread(attempt)
    assert message == "this job credential acts for job ids starting with 'team-b-', not 'team-a-9'"
    assert await controller.rollout_store.pin_owner("team-a-9") is None, "the future job's id stays free"


async def test_a_job_credential_cannot_read_forge_or_preempt_another_tenants_comparison(
    controller: Controller,
) -> None:
    from tests.controller.test_job_comparisons import VERSION

    a, b = await asyncio.to_thread(_issue, controller), await asyncio.to_thread(_issue, controller)

    def attempts() -> tuple[list[str], StoredComparison]:
        with AdminClient(f"127.0.0.1:{controller.port}", token=TOKEN) as admin:
            admin.put_config_version(dict(VERSION.files), dict(VERSION.provenance))
        with _client(controller, a.token) as tenant_a:
            for arm in (VERSION.id, "defaults"):
                tenant_a.resolve_job_config(JOB, ["n1", "n2"], arm=arm)
        refused = []
        with _client(controller, b.token) as tenant_b:
            # Pre-empting (the first record), forging a value, reading the runs back in the reply: all refused.
            for request in (_request(Arm.AGAINST), _request(None)):
                with pytest.raises(PermissionDenied) as caught:
                    tenant_b.record_job_comparison(*request)
                refused.append(str(caught.value).partition(" refused: ")[2])
        with _client(controller, a.token) as tenant_a:
            tenant_a.record_job_comparison(*_request(Arm.AGAINST))
            done = tenant_a.record_job_comparison(*_request(Arm.CANDIDATE))
        with _client(controller, b.token) as tenant_b:
            with pytest.raises(PermissionDenied) as caught:
                tenant_b.record_job_comparison(*_request(Arm.CANDIDATE))
            refused.append(str(caught.value).partition(" refused: ")[2])
        return refused, done

    refused, done = await asyncio.to_thread(attempts)
    assert set(refused) == {f"job '{JOB}' belongs to another credential"}
    assert done.figures is not None and done.figures.decision is Decision.FASTER, (
        "the owner's comparison was neither pre-empted nor forged"
    )


async def test_pins_and_comparisons_past_a_cap_are_refused_and_not_stored(capped: Controller) -> None:
    tenant = await asyncio.to_thread(_issue, capped)

    def attempts() -> list[str]:
        refused = []
        with _client(capped, tenant.token) as client:
            with pytest.raises(QuotaExceeded) as caught:
                client.resolve_job_config("big-1", [f"n{i:03d}-{'x' * 40}" for i in range(2)])
            refused.append(str(caught.value))
            for job in ("j1", "j2", "j3"):
                client.resolve_job_config(job, ["n1"])
            assert client.resolve_job_config("j3", ["n1"]).job_id == "j3", "asking again for a pin stores none"
            with pytest.raises(QuotaExceeded) as caught:
                client.resolve_job_config("j4", ["n1"])
            refused.append(str(caught.value))
        with AdminClient(f"127.0.0.1:{capped.port}", token=TOKEN) as admin:  # the admin is not capped
            assert admin.resolve_job_config("j5", ["n1"]).job_id == "j5"
        return refused

    refused = await asyncio.to_thread(attempts)
    assert refused[0] == ("nodes: 2 node names of 90 bytes in all, more than one row's cap (rowNodeBytes = 64)")
    assert refused[1].startswith("this job credential holds 3 pins, its cap (pinsPerCredential = 3)")
    assert await capped.rollout_store.pin_owner("big-1") is None
    assert await capped.rollout_store.pin_owner("j4") is None


async def test_comparisons_past_a_credentials_cap_are_refused_and_not_stored(capped: Controller) -> None:
    from tests.controller.test_job_comparisons import VERSION

    tenant = await asyncio.to_thread(_issue, capped)

    def attempts() -> str:
        with AdminClient(f"127.0.0.1:{capped.port}", token=TOKEN) as admin:
            admin.put_config_version(dict(VERSION.files), dict(VERSION.provenance))
        with _client(capped, tenant.token) as client:
            for arm in (VERSION.id, "defaults", "stable"):
                client.resolve_job_config(JOB, ["n1", "n2"], arm=arm)
            client.record_job_comparison(*_request(Arm.AGAINST))
            client.record_job_comparison(*_request(Arm.CANDIDATE))  # the same comparison: no new row
            # Another pair of arms (stable against defaults) would be a second comparison.
            second = _request(None, candidate="stable", candidate_version="", candidate_order=("n1", "n2"), runs=[])
            with pytest.raises(QuotaExceeded) as caught:
                client.record_job_comparison(*second)
        return str(caught.value)

    message = await asyncio.to_thread(attempts)
    assert message.startswith("this job credential holds 1 comparisons, its cap (comparisonsPerCredential = 1)")
    with AdminClient(f"127.0.0.1:{capped.port}", token=TOKEN) as admin:
        assert len(await asyncio.to_thread(admin.list_job_comparisons)) == 1


async def test_a_pin_of_thousands_of_long_names_is_refused_by_the_default_cap(controller: Controller) -> None:
    tenant = await asyncio.to_thread(_issue, controller)
    ghosts = [f"ghost-{i:05d}-{'x' * 238}" for i in range(6_000)]  # 1.5 MB of names: stored whole before

    def attempt() -> str:
        with _client(controller, tenant.token) as client, pytest.raises(QuotaExceeded) as caught:
            client.resolve_job_config("flood-1", ghosts)
        return str(caught.value)

    assert (await asyncio.to_thread(attempt)).startswith("nodes: 6000 node names of 1500000 bytes in all")
    assert await controller.rollout_store.pin_owner("flood-1") is None


async def test_a_scope_that_is_no_job_id_prefix_is_refused_naming_it(controller: Controller) -> None:
    env = cli_env(TOPO_TUNE_CONTROLLER=f"127.0.0.1:{controller.port}")
    bad = await asyncio.to_thread(run_cli, "admin", "credential", "issue", "--job", "--scope", "a b", env=env)
    assert bad.returncode != 0 and "scope" in bad.stderr and "not a valid job id" in bad.stderr, bad.stderr
    agent = await asyncio.to_thread(run_cli, "admin", "credential", "issue", "--node", "n1", "--scope", "x-", env=env)
    assert agent.returncode == 2 and "--scope is for --job credentials only" in agent.stderr
