"""How a speedup and its interval are written: the one way every output writes them.

Purpose: the CLI's verdict lines, ``summary.json``'s ``speedup_text`` and the report's tables and verdict
all show a speedup through :func:`speedup_text`, so one number never reads two ways. The point it is given
lies within its bounds by construction (``statistics.Bounds.point``), and rounding both ends and the point
the same way keeps it there on the page. It also says why the search's best and the proven figure differ
(``SEARCH_VS_PROOF``). An interval too wide to mean anything (:func:`precise` is false:
its ends further apart than a factor ``IMPRECISE_SPAN``, or unbounded) is written "not measured precisely
(n pairs, CV x %)" instead of bounds such as ``[0.000, 9410139.772]``; the report's plot clips it.

Non-goals: computing the point or its bounds (``statistics``, ``proof``).
"""

from __future__ import annotations

import math

__all__ = ["IMPRECISE_SPAN", "SEARCH_VS_PROOF", "precise", "speedup_text"]

IMPRECISE_SPAN = 4.0
"""The widest ``high / low`` still written as an interval. The decisions turn on a few percent (``maxLoss``
2 %, ``minEffect`` 3 % by default); an interval from a quarter to four times the point says only that the
pairs scattered, which is what the words say instead."""

SEARCH_VS_PROOF = (
    "the search's best is one run per size next to the baseline's, noisy and the best of many (so it reads "
    "high); it only picks the finalists. The proven figure comes from the interleaved A/B pairs against the "
    "defaults: what the decision rests on"
)
"""Why the search's best and the proven speedup differ, said wherever both are shown."""


def precise(low: float, high: float) -> bool:
    """Whether ``[low, high]`` is narrow enough to be worth printing as bounds."""
    return low > 0 and math.isfinite(high) and high / low <= IMPRECISE_SPAN


def speedup_text(point: float, interval: tuple[float, float], *, pairs: int, cv: float) -> str:
    """``1.435x [1.402, 1.454]``, or ``not measured precisely (10 pairs, CV 85 %)`` for a too-wide interval.

    ``interval`` is the speedup's (low, high) bounds, ``cv`` the larger coefficient of variation of the two
    sides' times (a fraction), ``pairs`` the pairs the bounds rest on.
    """
    low, high = interval
    if not precise(low, high):
        spread = f"CV {cv * 100:.0f} %" if math.isfinite(cv) else "CV unknown"
        return f"not measured precisely ({pairs} pairs, {spread})"
    return f"{point:.3f}x [{low:.3f}, {high:.3f}]"
