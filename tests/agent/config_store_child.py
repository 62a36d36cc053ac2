"""A process that applies config versions and may be killed anywhere: the crash tests' subject.

``python config_store_child.py ROOT step NAME``: apply version B and SIGKILL itself at step NAME.
``python config_store_child.py ROOT loop START``: apply new versions (and some old ones again) until killed.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from topo_tune.agent.config_store import ConfigStore
from topo_tune.versions.version import ConfigVersion, render_nccl_conf

A = ConfigVersion(
    {
        "nccl.conf": render_nccl_conf({"NCCL_MIN_CTAS": "4", "NCCL_NTHREADS": "256"}),
        "nccl_tuner.conf": "allreduce,0,65536,ring,simple,4,-1,-1,-1\n" * 200,
    }
)
B = ConfigVersion(
    {
        "nccl.conf": render_nccl_conf({"NCCL_MIN_CTAS": "16", "NCCL_BUFFSIZE": "8388608"}),
        "nccl_tuner.conf": "allreduce,0,65536,tree,ll,8,-1,-1,-1\n" * 300,
    }
)


def main() -> None:
    root, mode = Path(sys.argv[1]), sys.argv[2]
    if mode == "step":
        target = sys.argv[3]

        def step(name: str) -> None:
            if name == target:
                os.kill(os.getpid(), signal.SIGKILL)

        ConfigStore(root, step=step).apply(B.id, B.files)
        print("finished without reaching", target)
        return
    store = ConfigStore(root, keep=3)
    print("ready", flush=True)
    number = int(sys.argv[3])
    while True:
        number += 1
        fresh = ConfigVersion({**A.files, "nccl.conf": render_nccl_conf({"NCCL_MIN_CTAS": str(number % 64 + 1)})})
        for version in (fresh, A, B):
            store.apply(version.id, version.files)


if __name__ == "__main__":
    main()
