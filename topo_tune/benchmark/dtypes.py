"""Element types a benchmark may use, with their sizes and nccl-tests names.

The data check fills buffers with small integers (see ``topo_tune.agent.bench.data_check``), so
sums are exact in every type as long as they stay below the type's exact-integer limit;
``relative_tolerance`` only matters for the 16-bit floats on large worlds, where the order of
summation can round.

Non-goals: tensor code (the worker maps names to torch dtypes).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DTYPES", "DType", "dtype_named"]


@dataclass(frozen=True, slots=True)
class DType:
    name: str
    """The wire name (``RunBenchmark.dtype``), also torch's attribute name."""
    size: int
    nccl_tests_name: str
    """The name nccl-tests prints in its ``type`` column."""
    exact_integer_limit: int
    """Largest integer the type holds exactly (beyond it, sums may round)."""
    is_float: bool


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("float32", 4, "float", 2**24, True),
        DType("float64", 8, "double", 2**53, True),
        DType("float16", 2, "half", 2**11, True),
        DType("bfloat16", 2, "bfloat16", 2**8, True),
        DType("int32", 4, "int32", 2**31 - 1, False),
        DType("int64", 8, "int64", 2**63 - 1, False),
        DType("int8", 1, "int8", 127, False),
        DType("uint8", 1, "uint8", 255, False),
    )
}


def dtype_named(name: str) -> DType:
    """The dtype for a wire name; ``ValueError`` naming the field on anything else."""
    try:
        return DTYPES[name]
    except KeyError:
        known = ", ".join(sorted(DTYPES))
        raise ValueError(f"dtype {name!r} is not supported; use one of: {known}") from None
