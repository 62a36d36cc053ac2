"""Calibrated GPU profiles and the fabrics that go with them (sources and fits in ``docs/sim.md``).

Non-goal: a catalogue of every GPU. Add a profile when a measurement or a published figure backs it.
"""

from __future__ import annotations

from topo_tune.sim.cluster import FabricKind, GpuProfile, IntraNodeFabric

# H100 SXM on bare metal: 8-GPU NVSwitch ring all_reduce ~365-370 GB/s busbw with NVLS off, ~480 with NVLS.
H100_SXM = GpuProfile(
    name="h100-sxm",
    cta_gbs=26.0,
    link_efficiency=0.844,
    per_cta_us=0.01,
    ring_channels=32,
    channels_per_nic=4,
)
H100_NVSWITCH = IntraNodeFabric(kind=FabricKind.NVSWITCH, bandwidth_gbs=450.0, nvls=True)

# H200 SXM inside a VM (measured run in docs/sim.md: 2 GPUs, NCCL 2.28, 24 ring channels, ~19 µs small
# all_reduce, ~311 GB/s at 512 MiB; >=16 CTAs cut small-message time ~30%; no NVLS inside the VM).
H200_SXM_VM = GpuProfile(
    name="h200-sxm-vm",
    link_efficiency=0.705,
    launch_overhead_us=6.0,
    small_msg_cta_penalty_us=5.6,
    per_cta_us=0.0,
    ring_channels=24,
    channels_per_nic=4,
    cv=0.015,
)
H200_VM_NVSWITCH = IntraNodeFabric(kind=FabricKind.NVSWITCH, bandwidth_gbs=478.0, nvls=False)

# A PCIe-only node (e.g. L40S-class): gen4 x16 ~ 25 GB/s per direction, LL128 off.
PCIE_GPU = GpuProfile(name="pcie-gpu", cta_gbs=20.6, link_efficiency=0.8, ring_channels=8, channels_per_nic=4)
PCIE_GEN4 = IntraNodeFabric(kind=FabricKind.PCIE, bandwidth_gbs=25.0)
