"""Hand-made mutants of the env policy and config versions: the changes mutmut does not make.

mutmut mutates code inside functions. It leaves module-level data alone: the allow-list table, the
bounds, the regular expressions. A weakened entry there is the likeliest real regression, so each mutant
below is one such edit, named after what it would let through. Each is applied to a copy of the tree,
and the boundary's tests run against the copy. A mutant is killed when they fail. Prints one row per
mutant and the kill count.

Usage: ``python benchmarks/boundary_hand_mutants.py`` (from the repository root).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

POLICY = "topo_tune/benchmark/env_policy.py"
VERSION = "topo_tune/versions/version.py"
TESTS = ["tests/benchmark/test_env_policy.py", "tests/test_config_version.py"]

# (what it lets through, file, text, replacement)
MUTANTS = [
    ("NCCL_GRAPH_DUMP_FILE dropped from the list", POLICY, '    "NCCL_GRAPH_DUMP_FILE": OutputFile(),\n', ""),
    (
        "NCCL_TOPO_DUMP_FILE read, not confined",
        POLICY,
        '"NCCL_TOPO_DUMP_FILE": OutputFile()',
        '"NCCL_TOPO_DUMP_FILE": InputFile()',
    ),
    ("NCCL_DEBUG_FILE a plugin path", POLICY, '"NCCL_DEBUG_FILE": OutputFile()', '"NCCL_DEBUG_FILE": Plugin()'),
    ("torch pipe file unlisted", POLICY, '    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": OutputFile(),\n', ""),
    (
        "NCCL_IBVERBS_LIB accepted as a plugin",
        POLICY,
        '"NVSHMEM_DISABLE_NVLS": _BOOL,',
        '"NVSHMEM_DISABLE_NVLS": _BOOL, "NCCL_IBVERBS_LIB": Plugin(),',
    ),
    ("NCCL_IB_TIMEOUT 32 (waits forever)", POLICY, "Int(1, 31,", "Int(1, 32,"),
    ("NCCL_IB_TIMEOUT 0 (waits forever)", POLICY, "Int(1, 31,", "Int(0, 31,"),
    (
        "NCCL_SOCKET_NTHREADS up to 64",
        POLICY,
        '"NCCL_SOCKET_NTHREADS": Int(1, 16)',
        '"NCCL_SOCKET_NTHREADS": Int(1, 64)',
    ),
    ("socket product 65", POLICY, "_SOCKET_THREAD_PRODUCT_MAX = 64", "_SOCKET_THREAD_PRODUCT_MAX = 65"),
    ("P2P level SYS", POLICY, 'frozenset({"LOC", "NVL", "0"})', 'frozenset({"LOC", "NVL", "0", "SYS"})'),
    ("GDR level PHB", POLICY, 'frozenset({"LOC", "0"})', 'frozenset({"LOC", "0", "PHB"})'),
    ("graph stream ordering 0", POLICY, 'frozenset({"1"}), "NCCL_GRAPH', 'frozenset({"0", "1"}), "NCCL_GRAPH'),
    ("several ranks per GPU", POLICY, 'frozenset({"0"}), "several', 'frozenset({"0", "1"}), "several'),
    ("graph file without expert mode", POLICY, "InputFile(expert=True)", "InputFile()"),
    ("1024-character values", POLICY, "_MAX_VALUE_LEN = 1023", "_MAX_VALUE_LEN = 1024"),
    ("C1 control characters", POLICY, "0x7F <= ord(c) <= 0x9F", "0x7F <= ord(c) <= 0x7F"),
    ("octal and leading zeros", POLICY, 'r"^-?(0|[1-9][0-9]*)$"', 'r"^-?[0-9]+$"'),
    ("'/' in an output name", POLICY, "[A-Za-z0-9_.%-]{0,127}$", "[A-Za-z0-9_.%/-]{0,127}$"),
    ("leading '.' in an output name", POLICY, 'r"^[A-Za-z0-9_%][', 'r"^[A-Za-z0-9_.%]['),
    ("string-prefix containment", POLICY, "real_root in target.parents", "str(target).startswith(str(real_root))"),
    ("PYTHON* not a loader variable", POLICY, '("LD_", "PYTHON", ', '("LD_", '),
    ("allreduce: no longer a collective", POLICY, '"REDUCESCATTER", "ALLREDUCE"})', '"REDUCESCATTER"})'),
    ("4096-byte lines", VERSION, "_LINE_BYTES = 4095", "_LINE_BYTES = 4096"),
    ("1024-byte fields", VERSION, "_FIELD_BYTES = 1023", "_FIELD_BYTES = 1024"),
    (
        "/etc/nccl.conf elsewhere",
        VERSION,
        'SYSTEM_NCCL_CONF = Path("/etc/nccl.conf")',
        'SYSTEM_NCCL_CONF = Path("/etc/nccl/nccl.conf")',
    ),
    ("17-digit ids accepted", VERSION, r"^cv-[0-9a-f]{16}$", r"^cv-[0-9a-f]{16,17}$"),
    ("15-digit ids", VERSION, "hexdigest()[:16]", "hexdigest()[:15]"),
    ("ids over ASCII-escaped JSON", VERSION, "ensure_ascii=False", "ensure_ascii=True"),
    (
        "another file name allowed",
        VERSION,
        "FILE_NAMES = frozenset({NCCL_CONF,",
        'FILE_NAMES = frozenset({"env.sh", NCCL_CONF,',
    ),
    ("2 MiB files", VERSION, "MAX_FILE_BYTES = 1 << 20", "MAX_FILE_BYTES = 1 << 21"),
]


def _tests_pass(root: Path, mutant: tuple[str, str, str] | None) -> bool | None:
    """Run the tests on a copy with ``mutant`` (file, text, replacement) applied; None if it does not apply."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp)
        shutil.copytree(root / "topo_tune", copy / "topo_tune")
        shutil.copytree(root / "tests", copy / "tests")
        shutil.copy(root / "pyproject.toml", copy / "pyproject.toml")
        if mutant is not None:
            path, text, replacement = mutant
            source = (copy / path).read_text()
            if source.count(text) != 1:
                return None
            (copy / path).write_text(source.replace(text, replacement))
            compile((copy / path).read_text(), path, "exec")  # a mutant must be valid Python to count
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *TESTS],
            cwd=copy,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(copy), "HOME": tmp},
            capture_output=True,
            text=True,
            check=False,
        )
        return run.returncode == 0


def main() -> int:
    root = Path.cwd()
    if not _tests_pass(root, None):
        print("the tests fail without any mutant: fix them first")
        return 1
    killed = 0
    print(f"{'mutant':<42} {'result':<8}")
    for what, path, text, replacement in MUTANTS:
        passed = _tests_pass(root, (path, text, replacement))
        result = "NOT APPLIED" if passed is None else "SURVIVED" if passed else "killed"
        killed += passed is False
        print(f"{what:<42} {result}")
    print(f"\n{killed}/{len(MUTANTS)} hand-made mutants killed (the unmutated copy passes)")
    return 0 if killed == len(MUTANTS) else 1


if __name__ == "__main__":
    sys.exit(main())
