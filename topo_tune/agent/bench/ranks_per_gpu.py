"""The agent's ``--ranks-per-gpu N`` mode, for tests and development: N benchmark ranks share each GPU.

NCCL >= 2.30 runs several ranks on one GPU when ``NCCL_MULTI_RANK_GPU_ENABLE=1`` (older NCCL refuses with
"Multiple Ranks are using the same GPU/Partition"). That is real NCCL (kernels, transports, the tuner plugin's
calls and counters) on a machine with one GPU; its times are that GPU's memory and scheduler (start the CUDA
MPS daemon first, or the ranks time-slice), never links between GPUs, so the mode is for exercising topo-tune on
real NCCL, not for tuning a cluster. benchmarks/results/h200-one-gpu-ranks.md is what it measured.

- ``refusal``: why the mode cannot run here: a backend other than nccl, or an NCCL older than 2.30 (or none
  found) where the workers load it;
- ``worker_device``: the GPU of a rank the controller placed on device slot ``d`` (it numbers a node's ranks
  0..GPUs*N-1): ``d // N``, so ranks 0..N-1 share GPU 0;
- ``shared_gpu_env``: what every worker's environment gets on top of the job's: the multi-rank switch (which no
  job may set: the environment policy forbids it), and channels capped at ``CHANNELS_PER_GPU // N`` per rank:
  4 ranks on one H200 with NCCL's own 64 channels each crashed at 1 MiB (ring/LL), while 2 x 64 and 4 x 32 ran.

Non-goals: placing ranks on nodes (the controller's plan), starting MPS (the operator's), NCCL's version probe
(discovery's ``libnccl_version``).
"""

from __future__ import annotations

from collections.abc import Mapping

from topo_tune.nccl.backends import Backend

__all__ = ["CHANNELS_PER_GPU", "MIN_NCCL", "MULTI_RANK_ENV", "refusal", "shared_gpu_env", "worker_device"]

MIN_NCCL = (2, 30)
"""The first NCCL with ``NCCL_MULTI_RANK_GPU_ENABLE``."""
MULTI_RANK_ENV = "NCCL_MULTI_RANK_GPU_ENABLE"
CHANNELS_PER_GPU = 128
"""Channels all of a GPU's ranks may run together: below an H100's or H200's 132 SMs."""
_MAX_CHANNELS = "NCCL_MAX_NCHANNELS"
_MIN_CHANNELS = "NCCL_MIN_NCHANNELS"


def _version(text: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        return None


def refusal(ranks_per_gpu: int, *, backend: Backend, nccl_version: str | None) -> str:
    """Why ``ranks_per_gpu`` ranks cannot share each GPU here ("" when they can)."""
    if ranks_per_gpu <= 1:
        return ""
    if not backend.runs_nccl:
        return f"needs --backend nccl (got {backend.value}): only real NCCL runs several ranks on one GPU"
    need = ".".join(map(str, MIN_NCCL))
    if not nccl_version:
        return f"needs NCCL >= {need} where the benchmark workers load it, and no libnccl was found to ask"
    parsed = _version(nccl_version)
    if parsed is None or parsed[:2] < MIN_NCCL:
        return (
            f"needs NCCL >= {need} ({MULTI_RANK_ENV}) where the benchmark workers load it; that NCCL is "
            f"{nccl_version}, which refuses several ranks on one GPU"
        )
    return ""


def worker_device(device: int, ranks_per_gpu: int) -> int:
    """The GPU a rank planned on device slot ``device`` runs on (-1, no GPU, stays -1)."""
    return device if device < 0 else device // max(1, ranks_per_gpu)


def shared_gpu_env(env: Mapping[str, str], ranks_per_gpu: int) -> dict[str, str]:
    """``env`` with the multi-rank switch on and every rank's channels capped (unchanged for one rank a GPU)."""
    out = dict(env)
    if ranks_per_gpu <= 1:
        return out
    out[MULTI_RANK_ENV] = "1"
    cap = max(1, CHANNELS_PER_GPU // ranks_per_gpu)
    if (_count(out.get(_MAX_CHANNELS)) or cap + 1) > cap:
        out[_MAX_CHANNELS] = str(cap)
    if _MIN_CHANNELS in out and (_count(out[_MIN_CHANNELS]) or cap + 1) > cap:
        out[_MIN_CHANNELS] = str(cap)
    return out


def _count(text: str | None) -> int | None:
    """A channel count the job set, or None when it set none or not a number."""
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
