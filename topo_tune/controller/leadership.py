"""Leader-only service: a standby controller refuses agent and admin calls so that they go to the leader.

With leader election on, every replica serves gRPC, but only the Lease holder may accept agent sessions and
admin calls (both read and write the state that the leader's jobs own). A standby answers them with
``UNAVAILABLE`` (clients retry; agents reconnect with backoff), and its health service says ``NOT_SERVING``
for the agent and admin services, so a readiness probe on those keeps the Kubernetes Service pointing at the
leader. The health service itself is always open. The check is made per call, so a controller that loses
leadership refuses the next call at once; open agent sessions are closed by the controller at that moment.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from topo_tune.auth import GuardInterceptor

NOT_LEADER = "this controller is a standby, not the leader; retry (the Service routes to the leader)"


class LeaderOnlyInterceptor(GuardInterceptor):
    """Refuses every call but health checks with ``UNAVAILABLE`` while ``leading()`` is False."""

    def __init__(self, leading: Callable[[], bool]) -> None:
        self._leading = leading

    async def refusal(self, handler_call_details: grpc.HandlerCallDetails) -> tuple[grpc.StatusCode, str] | None:
        return None if self._leading() else (grpc.StatusCode.UNAVAILABLE, NOT_LEADER)
