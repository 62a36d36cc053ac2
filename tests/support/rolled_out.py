"""A version rolled out to a test controller's agents and waited for: the stable version jobs then get."""

from __future__ import annotations

import asyncio

from tests.support.processes import TOKEN
from tests.support.waiting import async_wait_until
from topo_tune.client.admin import AdminClient
from topo_tune.ids import RolloutId
from topo_tune.rollout_record import RolloutRequest
from topo_tune.versions.version import ConfigVersion


async def roll_out(address: str, version: ConfigVersion, *, rollout_id: str = "ro-1") -> None:
    """Roll ``version`` out (no canary) through the controller at ``address`` and wait until it completed."""
    request = RolloutRequest(files=dict(version.files), actor="test", rollout_id=RolloutId(rollout_id), no_canary=True)
    with AdminClient(address, token=TOKEN) as client:
        await asyncio.to_thread(client.create_rollout, request)

        async def completed() -> bool:
            return (await asyncio.to_thread(client.get_rollout, RolloutId(rollout_id))).phase == "completed"

        await async_wait_until(completed, timeout=60, what=f"the rollout of {version.id} to complete")
