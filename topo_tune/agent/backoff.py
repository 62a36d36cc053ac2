"""Reconnect delays: exponential growth with full jitter, reset after a session that worked; and which
controller answers are worth a reconnect at all.

Full jitter (a uniform draw between 0 and the exponential cap) spreads a fleet's reconnects after a
controller restart, so thousands of agents do not arrive in the same second.

An answer heals when waiting can change it: the controller unreachable, restarting, overloaded, a deadline.
One does not when only the operator can: the token refused (UNAUTHENTICATED), a credential that is another
node's or revoked (PERMISSION_DENIED), a registration the controller cannot accept (INVALID_ARGUMENT before
``Registered``: an invalid node name). Retrying those forever only fills a log; the agent exits instead,
except that a token read from ``--token-file`` is retried for ``token_grace_s`` while the file may be
rewritten (kubelet rotates a projected token in place).
An INVALID_ARGUMENT after registration is about one message of a working session and heals by reconnecting.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import grpc

NEVER_HEALS = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


def heals(code: grpc.StatusCode, *, registered: bool) -> bool:
    """Whether a session that ended with ``code`` is worth another attempt."""
    if code in NEVER_HEALS:
        return False
    return registered or code is not grpc.StatusCode.INVALID_ARGUMENT


@dataclass
class Backoff:
    initial_s: float
    max_s: float
    rng: random.Random = field(default_factory=random.Random)
    _attempt: int = 0

    def next_delay(self) -> float:
        cap = min(self.max_s, self.initial_s * (2**self._attempt))
        self._attempt = min(self._attempt + 1, 32)
        return self.rng.uniform(0, cap)

    def reset(self) -> None:
        self._attempt = 0
