"""A GPU's memory technology as a prior for its memory efficiency (``GpuSpec.mem_efficiency``).

``mem_efficiency`` is the fraction of the datasheet bandwidth the step-time model's weight reads
reach. For GPUs without a kernel profile it defaults to the mean of the H100 and A100 fits on
Vidur's profiles (:mod:`tokenplane.sim.catalog_specs`). Those are HBM cards; a GDDR card reaches a
larger share of its (smaller) datasheet figure with a plain streaming read, because it needs fewer
bytes in flight to cover its latency. This module scales the documented mean by how far a card's
memory technology reaches in one independent, published streaming-read benchmark, relative to the
same benchmark on the chips the mean was fitted on::

    prior(memory_type) = DEFAULT_MEM_EFFICIENCY * read_fraction(memory_type) / read_fraction("hbm2e")

The kernel part of the efficiency (what the serving kernels reach of what the memory can deliver)
is kept from the Vidur fits; only the memory-system part is transferred. Nothing here is fitted to
the vLLM measurements.

Source: te42kyfo/gpu-benches (Dominik Ernst, NHR@FAU), ``gpu-stream`` and ``cuda-stream`` result
files, https://github.com/te42kyfo/gpu-benches (``gpu-stream/{v100,a100_40,a40,l40,h200}.txt``,
``cuda-stream/{a100_80,h100_pcie}.txt``). Figure used: the ``read`` kernel (``sum = A[i]``, one load
stream, like a weight read), its maximum over the occupancy scan, over the datasheet bandwidth:

=========  ==========================================================  ===========
type       cards (measured GB/s / datasheet GB/s)                      fraction
=========  ==========================================================  ===========
hbm2       V100 PCIe 866 / 900 = 0.962; A100 SXM4 40 GB 1490 / 1555      0.960
           = 0.958
hbm2e      A100 SXM4 80 GB 1769 / 2039 = 0.868; H100 PCIe 1942 / 2039    0.910
           = 0.952 (the A100 and H100 chips of the documented mean)
gddr6      L40 844 / 864 = 0.977; A40 679 / 696 = 0.976                   0.976
=========  ==========================================================  ===========

Not in the table (their prior is the documented mean, ratio 1):

* ``hbm3e``: H200 reads 2756 / 4800 = 0.574, still rising at 100 % occupancy: the benchmark's
  kernel does not saturate HBM3e, so it is not an achievable-bandwidth figure. ``hbm3``: no card.
* ``gddr6x`` is given the ``gddr6`` fraction. gpu-benches has no GDDR6X card; an independent copy
  kernel (xytpai/nvbench ``standard/global_memory_bandwidth.cu``, README, float4) puts the GDDR6X
  RTX 4090 at 921.9 / 1008 = 0.915 and the HBM2 A100 40 GB at 1378.8 / 1555 = 0.887, a ratio of
  1.031, against 0.976 / 0.960 = 1.017 for GDDR6 over HBM2 in gpu-benches: GDDR6X stands at least
  as well as GDDR6 (the figure used is the smaller one).
* ``gddr7``: no card in gpu-benches. binbinsh/gpu-bench (README, device-to-device memcpy) has the
  GDDR7 RTX 5090 D at 1528.8 / 1792 = 0.853 and the GDDR6X RTX 4090 at 918.8 / 1008 = 0.911; chained
  onto the GDDR6 figure that is 0.914, within 0.5 % of the HBM2e reference, so the mean stands.

How it fails: a read stream is an upper bound of what GEMV/GEMM weight reads reach; the ratio
assumes the kernel factor is the same on every memory technology. An entry's own
``mem_efficiency`` always wins over this prior.
"""

from __future__ import annotations

from typing import Literal, get_args

from tokenplane.sim.catalog_specs import DEFAULT_MEM_EFFICIENCY

MemoryType = Literal["hbm2", "hbm2e", "hbm3", "hbm3e", "gddr6", "gddr6x", "gddr7"]
MEMORY_TYPES: tuple[str, ...] = get_args(MemoryType)

# gpu-benches streaming-read fractions (see the module docstring for every card's figures).
_HBM2 = (866 / 900 + 1490 / 1555) / 2
_HBM2E = (1769 / 2039 + 1942 / 2039) / 2
_GDDR6 = (844 / 864 + 679 / 696) / 2
READ_FRACTION: dict[str, float] = {"hbm2": _HBM2, "hbm2e": _HBM2E, "gddr6": _GDDR6, "gddr6x": _GDDR6}
# The chips of the documented mean (A100, H100) as the same benchmark measured them.
REFERENCE_READ_FRACTION = _HBM2E


def memory_type_ratio(memory_type: str | None) -> float:
    """How much more of its datasheet bandwidth ``memory_type`` reaches than the reference HBM2e
    (1 for ``None`` or a technology without a figure)."""
    if memory_type is None:
        return 1.0
    key = memory_type.strip().lower()
    if key not in MEMORY_TYPES:
        raise ValueError(f"unknown memory_type {memory_type!r}; one of {', '.join(MEMORY_TYPES)}")
    return READ_FRACTION.get(key, REFERENCE_READ_FRACTION) / REFERENCE_READ_FRACTION


def mem_efficiency_prior(memory_type: str | None) -> float:
    """The documented mean memory efficiency scaled by ``memory_type``'s ratio, at most 1."""
    return min(1.0, DEFAULT_MEM_EFFICIENCY * memory_type_ratio(memory_type))
