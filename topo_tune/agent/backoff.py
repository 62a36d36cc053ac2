"""Reconnect delays: exponential growth with full jitter, reset after a session that worked.

Full jitter (a uniform draw between 0 and the exponential cap) spreads a fleet's reconnects after a
controller restart, so thousands of agents do not arrive in the same second.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


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
