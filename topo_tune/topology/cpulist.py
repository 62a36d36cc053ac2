"""Linux cpulists ("0-15,32-47") and NVML CPU-affinity bitmasks.

Purpose: parse and print the kernel's cpulist format and turn NVML's array of 64-bit affinity words into it.
Non-goals: CPU pinning.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from topo_tune.errors import CpuListError


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Parse ``"0-3,8,10-11"`` into sorted CPU ids; an empty string is no CPUs."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        try:
            if "-" in part:
                low, high = part.split("-", 1)
                lo, hi = int(low), int(high)
                if hi < lo:
                    raise CpuListError(f"cpulist range {part!r} runs backwards")
                cpus.update(range(lo, hi + 1))
            else:
                cpus.add(int(part))
        except ValueError as exc:
            raise CpuListError(f"cpulist {text!r}: bad element {part!r}") from exc
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """Print CPU ids the way the kernel does: ``0-3,8,10-11``."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    start = prev = None
    for cpu in ordered:
        if start is None:
            start = prev = cpu
        elif prev is not None and cpu == prev + 1:
            prev = cpu
        else:
            parts.append(f"{start}-{prev}" if start != prev else f"{start}")
            start = prev = cpu
    if start is not None:
        parts.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ",".join(parts)


def cpulist_from_mask_words(words: Sequence[int], *, bits_per_word: int = 64) -> str:
    """NVML returns affinity as an array of unsigned longs, CPU 0 in the lowest bit of word 0."""
    cpus = [
        index * bits_per_word + bit
        for index, word in enumerate(words)
        for bit in range(bits_per_word)
        if (word >> bit) & 1
    ]
    return format_cpulist(cpus)


def cpulist_from_hex_mask(mask: str) -> str:
    """NCCL's XML ``affinity="ffffffff,ffff0000,00000000"``: comma-separated 32-bit hex words, highest first."""
    words = [w for w in mask.strip().split(",") if w]
    value = 0
    for word in words:
        value = (value << 32) | int(word, 16)
    return format_cpulist(bit for bit in range(value.bit_length()) if (value >> bit) & 1)


def hex_mask_from_cpulist(cpulist: str) -> str:
    """The inverse of `cpulist_from_hex_mask`, padded to whole 32-bit words as NCCL writes it."""
    cpus = parse_cpulist(cpulist)
    if not cpus:
        return ""
    value = 0
    for cpu in cpus:
        value |= 1 << cpu
    nwords = cpus[-1] // 32 + 1
    return ",".join(f"{(value >> (32 * i)) & 0xFFFFFFFF:08x}" for i in reversed(range(nwords)))
