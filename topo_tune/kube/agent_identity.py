"""An agent's node, proven by Kubernetes: its pod's projected service-account token, checked by TokenReview.

In a cluster, the agent DaemonSet mounts a service-account token with the audience ``topo-tune``; kubelet
binds it to the pod, and (Kubernetes 1.30+) the API server's TokenReview names the pod's node in the user's
``extra``. The controller accepts such a token as the agent credential of exactly that node when it belongs to
the agents' service account. Answers are cached briefly (a session is reviewed once, not every call) and a
review that fails counts as "not a credential": the caller is refused, never let through.

Non-goal: any other Kubernetes identity (users, other service accounts) means nothing to topo-tune.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Callable

from topo_tune.errors import KubernetesError
from topo_tune.kube.objects import TokenReview

logger = logging.getLogger(__name__)

AUDIENCE = "topo-tune"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
_JWT = re.compile(rb"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\Z")
MAX_TOKEN_BYTES = 8192
"""A service-account token is a JWT of a few hundred bytes to a few KiB; anything else is not reviewed."""
MAX_CONCURRENT_REVIEWS = 4
"""Unauthenticated callers cannot turn the controller into a TokenReview flood against the API server."""


class AgentTokenReviewer:
    """``node_of(token)``: the node an agent's service-account token is bound to, or None."""

    def __init__(
        self,
        review: Callable[[str, list[str]], TokenReview],
        *,
        service_account: str,
        ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        namespace, _, name = service_account.partition(":")
        self._username = f"system:serviceaccount:{namespace}:{name}"
        self._review = review
        self._ttl_s = ttl_s
        self._clock = clock
        self._cache: dict[bytes, tuple[float, str | None]] = {}
        self._reviews = asyncio.Semaphore(MAX_CONCURRENT_REVIEWS)

    async def node_of(self, token: bytes) -> str | None:
        if len(token) > MAX_TOKEN_BYTES or not _JWT.match(token):
            return None
        key = hashlib.sha256(token).digest()
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            async with self._reviews:
                review = await asyncio.to_thread(self._review, token.decode("ascii"), [AUDIENCE])
        except KubernetesError as error:
            logger.warning("could not review an agent's token: %s", error)
            return None  # not cached: the next attempt asks again
        node = self._node(review)
        if len(self._cache) > 10_000:
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
        self._cache[key] = (now + self._ttl_s, node)
        return node

    def _node(self, review: TokenReview) -> str | None:
        if not review.authenticated or review.username != self._username or AUDIENCE not in review.audiences:
            return None
        nodes = review.extra.get(NODE_NAME_EXTRA, ())
        return nodes[0] if len(nodes) == 1 and nodes[0] else None
