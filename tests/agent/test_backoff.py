"""Reconnect delays: exponential, capped, fully jittered, and reset after a working session."""

from __future__ import annotations

import random

from topo_tune.agent.backoff import Backoff


def test_delays_grow_to_the_cap_with_full_jitter() -> None:
    backoff = Backoff(initial_s=0.5, max_s=8.0, rng=random.Random(3))
    caps = [0.5, 1, 2, 4, 8, 8, 8]
    delays = [backoff.next_delay() for _ in caps]
    assert all(0 <= d <= cap for d, cap in zip(delays, caps, strict=True))
    samples = [Backoff(initial_s=0.5, max_s=8.0, rng=random.Random(seed)) for seed in range(200)]
    firsts = [b.next_delay() for b in samples]
    assert max(firsts) <= 0.5
    assert min(firsts) < 0.05, "full jitter reaches down to almost no delay"
    assert max(firsts) > 0.45, "and up to the whole window"


def test_reset_starts_again_from_the_initial_delay() -> None:
    backoff = Backoff(initial_s=1.0, max_s=30.0, rng=random.Random(0))
    for _ in range(10):
        backoff.next_delay()
    backoff.reset()
    assert backoff.next_delay() <= 1.0
