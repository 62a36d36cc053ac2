"""Node discovery for the agent: NVML + sysfs into a `topo_tune.v1.NodeTopology`.

The agent calls `discover()` (in a thread: NVML calls block). Tests and fixture recording use the hardware-edge
pieces in `nvml`, `sysfs` and `snapshot`.
"""

from topo_tune.agent.discovery.discover import discover

__all__ = ["discover"]
