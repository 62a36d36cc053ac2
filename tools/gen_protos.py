"""Regenerate the Python code for the wire contract in ``protos/``.

The ``.proto`` files live under ``protos/topo_tune/v1/`` so that protoc's output
lands in ``topo_tune/v1/`` with import paths that need no patching. The
generated files are committed; ``tests/test_protos.py`` fails when running this
script would change them.

Usage: ``python tools/gen_protos.py [OUTPUT_ROOT]`` (default: the repository root).
"""

from __future__ import annotations

import shutil
import sys
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"


def proto_files() -> list[Path]:
    return sorted((PROTO_ROOT / "topo_tune" / "v1").glob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    """Generate into ``out_root/topo_tune/v1`` and return the files written."""
    out_dir = out_root / "topo_tune" / "v1"
    out_dir.mkdir(parents=True, exist_ok=True)
    well_known = str(resources.files("grpc_tools") / "_proto")
    mypy_plugin = shutil.which("protoc-gen-mypy", path=str(Path(sys.executable).parent))
    mypy_grpc_plugin = shutil.which("protoc-gen-mypy_grpc", path=str(Path(sys.executable).parent))
    if mypy_plugin is None or mypy_grpc_plugin is None:
        raise SystemExit("protoc-gen-mypy not found next to this Python: pip install mypy-protobuf")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--plugin=protoc-gen-mypy={mypy_plugin}",
        f"--plugin=protoc-gen-mypy_grpc={mypy_grpc_plugin}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *(str(p.relative_to(PROTO_ROOT)) for p in proto_files()),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p for p in out_dir.iterdir() if "_pb2" in p.name)


def main() -> None:
    out_root = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    for path in generate(out_root):
        print(path.relative_to(out_root))


if __name__ == "__main__":
    main()
