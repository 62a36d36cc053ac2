"""The types of value an environment variable takes: each says why a value is refused, or None.

- :class:`Int` — a decimal integer in a range. Only ``-?[0-9]+`` without leading zeros: NCCL reads
  integers with ``strtoll(value, NULL, 0)`` (``src/misc/param.cc``), which takes ``010`` as 8, ``0x10``
  as 16 and ``12abc`` as 12; such spellings are refused so the value checked is the value NCCL uses.
- :class:`Choice` — one of a set of words (``NCCL_DEBUG``, ``NCCL_P2P_LEVEL``...), case-insensitive.
- :class:`Pattern` — a list syntax NCCL parses itself (HCA and interface lists, subsystems, algorithms).
- :class:`Proto` — ``NCCL_PROTO``, a protocol list that must keep LL128 out (an explicit list forces LL128
  on, NCCL_FACTS §1.2).
- :class:`Plugin` — ``none`` or an absolute path inside the agent's plugin directories.
- :class:`InputFile` — a file NCCL reads: an absolute path inside the agent's config directories.
- :class:`OutputFile` — a file NCCL or torch writes: a bare name the agent rewrites into the job's directory.

Paths are checked by the environment policy, which knows the agent's directories; the others check
themselves (:meth:`reason`). Non-goal: which variables exist (the catalogue).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DECIMAL = re.compile(r"^-?(0|[1-9][0-9]*)\Z")


@dataclass(frozen=True, slots=True)
class Int:
    low: int
    high: int
    why: str = ""
    """Said when a value is out of range (e.g. which values hang)."""

    def reason(self, value: str) -> str | None:
        if not DECIMAL.match(value):
            return f"must be a decimal integer in {self.low}..{self.high}"
        if not self.low <= int(value) <= self.high:
            return f"{value} is outside {self.low}..{self.high}" + (f" ({self.why})" if self.why else "")
        return None

    def describe(self) -> str:
        return f"integer {self.low}..{self.high}"


@dataclass(frozen=True, slots=True)
class Choice:
    words: frozenset[str]
    why: str = ""
    """Said when a value is refused (e.g. which values hang)."""

    def reason(self, value: str) -> str | None:
        if value.upper() in self.words:
            return None
        return f"must be one of {', '.join(sorted(self.words))}" + (f" ({self.why})" if self.why else "")

    def describe(self) -> str:
        return "one of " + ", ".join(sorted(self.words, key=lambda w: (not w.isdigit(), w.zfill(8))))


@dataclass(frozen=True, slots=True)
class Pattern:
    regex: re.Pattern[str]
    shape: str

    def reason(self, value: str) -> str | None:
        return None if self.regex.fullmatch(value) else f"must look like {self.shape}"

    def describe(self) -> str:
        return f"like {self.shape}"


PROTOCOLS = frozenset({"LL", "LL128", "SIMPLE"})
COLLECTIVE_FUNCS = frozenset({"BROADCAST", "REDUCE", "ALLGATHER", "REDUCESCATTER", "ALLREDUCE"})
"""The collective names NCCL's per-collective list syntax (``allreduce:...``) accepts."""


@dataclass(frozen=True, slots=True)
class Proto:
    """``NCCL_PROTO``: 2.24+ syntax ``protos;func:protos;...``; every segment must keep LL128 out."""

    def reason(self, value: str) -> str | None:
        for segment in value.split(";"):
            func, colon, spec = segment.rpartition(":")
            if colon and func.strip().upper() not in COLLECTIVE_FUNCS:
                return f"unknown collective {func.strip()!r} in NCCL_PROTO"
            spec = spec.strip()
            if not spec:
                return "an empty NCCL_PROTO segment"
            excluded = spec.startswith("^")
            tokens = {t.strip().upper() for t in spec.removeprefix("^").split(",")}
            unknown = tokens - PROTOCOLS
            if unknown:
                return f"unknown protocol(s) {sorted(unknown)}"
            if excluded and "LL128" not in tokens:
                return "an NCCL_PROTO exclusion list that keeps LL128 forces LL128 on, which can corrupt data"
            if not excluded and "LL128" in tokens:
                return "listing LL128 in NCCL_PROTO forces it on, bypassing NCCL's safety checks (data corruption)"
        return None

    def describe(self) -> str:
        return "a protocol list that excludes LL128 (^LL128, allreduce:^LL128;...)"


@dataclass(frozen=True, slots=True)
class Plugin:
    """``none``, or an absolute path inside the agent's plugin directories."""

    def describe(self) -> str:
        return "none, or a library inside the agent's plugin directories"


@dataclass(frozen=True, slots=True)
class InputFile:
    """A file NCCL reads: an absolute path inside the agent's config directories."""

    expert: bool = False

    def describe(self) -> str:
        where = "a file inside the agent's config directories"
        return where + (" (expert mode only)" if self.expert else "")


@dataclass(frozen=True, slots=True)
class OutputFile:
    """A file NCCL or torch writes: a bare name, rewritten into the job's own directory."""

    def describe(self) -> str:
        return "a bare file name, written into the job's directory"


ValueType = Int | Choice | Pattern | Proto | Plugin | InputFile | OutputFile
