"""Show on a real GPU that NCCL loads topo-tune's tuner plugin and follows its table.

Builds ``libnccl-tuner-topotune.so`` from the package, writes a small table, and runs ``torch.distributed``
all_reduce over NCCL in several scenarios, each in fresh processes:

- ``baseline``: two ranks, no tuner plugin: NCCL's own choices;
- ``plugin``: the same two ranks with ``NCCL_TUNER_PLUGIN`` and the table: NCCL's choices follow the table;
- ``by-name``: the same with ``NCCL_TUNER_PLUGIN=topotune`` and the library's directory on ``LD_LIBRARY_PATH``;
- ``single``: one rank with the plugin (NCCL skips tuning for one-rank communicators);
- ``same-gpu``: two ranks on one GPU without ``NCCL_HOSTID`` (NCCL refuses duplicate GPUs on one host).

On a one-GPU machine the two ranks share the GPU: each gets its own ``NCCL_HOSTID``, so NCCL sees two
single-GPU nodes joined by its socket transport over loopback. That exercises the real plugin path
(nNodes=2, nRanks=2) but says nothing about speed, so no times are reported.

Prints, per scenario and size, NCCL's own ``Algo/proto/channel`` log line and whether the sum was right;
writes every rank's full log under ``--out`` (the library and table go to a temporary directory).
Non-goal: performance measurement.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

SIZES = (4096, 32768, 262144, 4194304, 67108864)  # bytes, float32 elements x 4
TABLE = """\
# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff
allreduce,0,65536,ring,ll,1,2,2
allreduce,65537,1048576,tree,ll128,2,2,2
allreduce,65537,1048576,tree,simple,2,2,2
allreduce,1048577,17179869184,ring,simple,1,2,2
allreduce,0,17179869184,tree,ll,4,1,8
allgather,0,17179869184,nvls,simple,4,-1,-1
allreduce,0,1k,ring,simple,4,-1,-1
"""
NCCL_CHOICE = re.compile(r"AllReduce: (\d+) Bytes -> Algo (\w+) proto (\w+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def worker(rank: int, world: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=device
    )
    print(f"PROBE nccl {torch.cuda.nccl.version()} torch {torch.__version__}", flush=True)
    for n_bytes in SIZES:
        tensor = torch.full((n_bytes // 4,), float(rank + 1), device=device)
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        expected = world * (world + 1) / 2
        ok = bool(torch.all(tensor == expected).item())
        print(f"PROBE size {n_bytes} sum {'ok' if ok else 'WRONG'}", flush=True)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_scenario(name: str, *, world: int, extra_env: dict[str, str], host_ids: bool, out: Path) -> list[str]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, **SAFE_ENV, **extra_env}
        env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,TUNING", NCCL_IB_DISABLE="1")
        env.update(NCCL_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
        if host_ids:
            env["NCCL_HOSTID"] = f"topotune-probe-host-{rank}"
        log = (out / f"{name}-rank{rank}.log").open("w")
        cmd = [sys.executable, __file__, "--worker", str(rank), str(world), str(port)]
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    for proc, log in procs:
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    print(f"\n## {name} (exit codes {[p.returncode for p, _ in procs]})")
    lines = (out / f"{name}-rank0.log").read_text().splitlines()
    if procs[0][0].returncode != 0:
        print("    rank 0 log ends:", *lines[-4:], sep="\n    ")
    return lines


def summarize(lines: list[str]) -> None:
    for line in lines:
        if "TUNER/" in line or line.startswith("PROBE") or "Duplicate GPU" in line or NCCL_CHOICE.search(line):
            print("   ", line.split("NCCL INFO ", 1)[-1].split("NCCL WARN ", 1)[-1][:220])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    from topo_tune.plugin import build_plugin, plugin_env

    work = Path(tempfile.mkdtemp(prefix="topotune-probe-"))
    built = build_plugin(work)
    print(f"built {built.path} with {' '.join(built.compiler)} {built.diagnostics}")
    table = work / "tuner-table.csv"
    table.write_text(TABLE)
    with_plugin = plugin_env(table, built.path)

    summarize(run_scenario("baseline", world=2, extra_env={}, host_ids=True, out=out))
    summarize(run_scenario("plugin", world=2, extra_env=with_plugin, host_ids=True, out=out))
    by_name = {
        **with_plugin,
        "NCCL_TUNER_PLUGIN": "topotune",
        "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(work), os.environ.get("LD_LIBRARY_PATH")])),
    }
    summarize(run_scenario("by-name", world=2, extra_env=by_name, host_ids=True, out=out))
    summarize(run_scenario("single", world=1, extra_env=with_plugin, host_ids=False, out=out))
    summarize(run_scenario("same-gpu", world=2, extra_env=with_plugin, host_ids=False, out=out))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
