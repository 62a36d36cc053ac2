"""The metric of a run: the last match of the user's ``--metric`` regular expression in the run's output.

The job prints its own figure (``step_time=0.412``, ``throughput: 1234 samples/s``); group 1 of the last match
is that run's value, as a float. The output is matched line by line, as it streams, so a long training run's
log is never held in memory; a pattern therefore cannot span lines. The last match counts because the figure
a job prints at its end (an average over its steps) is the one meant, and a warm-up line printed earlier is
not. Every value must be finite and positive: the statistics compare ratios of values.

Non-goals: reading the output (the CLI's runner feeds the lines), deciding which node reads it (the one that
is node rank 0 of the run does).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from topo_tune.errors import ConfigError, MetricNotFound

FLAG = "--metric"


def compile_metric(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled; ``ConfigError`` naming ``--metric`` when it is invalid or has no group 1."""
    if not pattern:
        raise ConfigError(FLAG, "give a regular expression whose group 1 is the figure, e.g. 'step_time=([0-9.]+)'")
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        raise ConfigError(FLAG, f"not a valid regular expression ({error}): {pattern!r}") from None
    if compiled.groups < 1:
        raise ConfigError(FLAG, f"needs a group, (...), around the figure: {pattern!r}")
    return compiled


@dataclass
class MetricReader:
    """Fed a run's output line by line; keeps the last match's group 1."""

    pattern: re.Pattern[str]
    last: str | None = field(default=None, init=False)

    def feed(self, line: str) -> None:
        for match in self.pattern.finditer(line):
            if match.group(1) is not None:
                self.last = match.group(1)

    def value(self, run: str) -> float:
        """The run's value; ``MetricNotFound`` naming ``run`` when none was printed or it is no positive number."""
        if self.last is None:
            raise MetricNotFound(f"{run} printed nothing matching {FLAG} '{self.pattern.pattern}'")
        try:
            value = float(self.last)
        except ValueError:
            raise MetricNotFound(
                f"{run}: {FLAG} '{self.pattern.pattern}' matched {self.last!r}, which is not a number"
            ) from None
        if not (math.isfinite(value) and value > 0):
            raise MetricNotFound(f"{run}: {FLAG} matched {self.last!r}; the metric must be finite and > 0")
        return value


def parse_metric(pattern: re.Pattern[str], output: str, *, run: str) -> float:
    """The value of ``run`` in a whole ``output`` (the streaming reader's result for the same lines)."""
    reader = MetricReader(pattern)
    for line in output.splitlines():
        reader.feed(line)
    return reader.value(run)
