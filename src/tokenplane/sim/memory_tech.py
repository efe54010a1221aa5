"""A GPU's memory technology as a prior for its memory efficiency (``GpuSpec.mem_efficiency``).

``mem_efficiency`` is the fraction of the datasheet bandwidth the step-time model's weight reads
reach. For GPUs without a kernel profile it defaults to the mean of the H100 and A100 fits on
Vidur's profiles (:mod:`tokenplane.sim.catalog_specs`). Those are HBM cards; a GDDR card reaches a
larger share of its (smaller) datasheet figure in a streaming kernel, because it needs fewer bytes
in flight to cover its latency. This module scales the documented mean by how far a card's memory
technology reaches in one published, bandwidth-bound benchmark, relative to the same benchmark on
the two chips the mean was fitted on (Vidur's A100 SXM4 80 GB and H100 SXM, HBM3)::

    prior(memory_type) = DEFAULT_MEM_EFFICIENCY * fraction(memory_type) / REFERENCE_FRACTION

The kernel part of the efficiency (what the serving kernels reach of what the memory can deliver)
is kept from the Vidur fits; only the memory-system part is transferred. Nothing here is fitted to
the vLLM measurements.

Source: ProjectPhysX/FluidX3D, ``README.md``, "Single-GPU/CPU Benchmarks" table,
https://github.com/ProjectPhysX/FluidX3D. One program (D3Q19 lattice Boltzmann, FP32/FP32 column,
153 bytes of memory traffic per cell update, 2.37 FLOP/byte: bandwidth-bound on every GPU) run on
every card; the figure used is the table's own roofline efficiency, measured MLUPs/s x 153 B over
the table's datasheet bandwidth. It is the one public table found with both reference chips, the
H100 SXM (HBM3) and A100 SXM4 80 GB, and GDDR6X and GDDR7 cards, measured the same way.

The rule, fixed before any replay of the shared runs: the reference is the mean of the two Vidur
chips' fractions; a memory type's fraction is the median over every NVIDIA GPU of the Ampere,
Hopper, Ada Lovelace and Blackwell generations (those of the reference chips and of the
catalogue's cards; laptop parts included) in that table with that memory type (``FLUIDX3D`` below
lists each one). PG506-242/243 is left out: no public datasheet names its memory type.

=========  ==========================================================================  ========
type       cards (fraction of datasheet bandwidth)                                     median
=========  ==========================================================================  ========
reference  A100 SXM4 80 GB 0.767, H100 SXM5 80 GB HBM3 0.804 (mean)                    0.786
hbm2       A100 SXM4 40 GB 0.839, A100 PCIe 40 GB 0.839, A30 0.821                     0.839
hbm2e      H100 PCIe 0.851, CMP 170HX 0.788, A100 SXM4 80 GB 0.767, A100 PCIe 80 GB    0.778
           0.764
hbm3       H100 SXM5 0.804, H100 NVL 0.789, GH200 94 GB 0.788                          0.789
hbm3e      B300 0.813, B200 0.806, H200 0.735                                          0.806
gddr6      26 cards, 0.671 (L40S) .. 0.941 (RTX 3050M Ti)                              0.886
gddr6x     12 cards, 0.803 (RTX 4070) .. 0.886 (RTX 3090); RTX 4090 0.854              0.851
gddr7      RTX PRO 6000 Blackwell 0.884, RTX 5070 0.833, RTX 5090M 0.825, RTX 5080     0.825
           0.825, RTX 5090 0.813
=========  ==========================================================================  ========

How it fails: the benchmark reads and writes (about half each), while weight reads are pure
reads; the spread within a type is wide (GDDR6: the ECC-capable data-centre L40S/L40/A40/A10 at
0.67-0.75, consumer cards near 0.9), so a card can sit well off its type's median (the RTX PRO
6000 Blackwell at 0.884 against GDDR7's 0.825). The ratio assumes the kernel factor is the same on
every memory technology. An entry's own ``mem_efficiency`` always wins over this prior.

Earlier figures, kept as cross-checks, not used: te42kyfo/gpu-benches' pure-read kernel has the
A100 SXM4 80 GB at 0.868 and the H100 *PCIe* (HBM2e) at 0.952 but no H100 SXM; its PCIe card is
not the chip the mean was fitted on (FluidX3D too has the PCIe card 0.05 above the SXM one).
binbinsh/gpu-bench's device-to-device memcpy has the GDDR7 RTX 5090 D at 0.853 and the GDDR6X
RTX 4090 at 0.911 (ratio 0.936; FluidX3D's RTX 5090 / RTX 4090: 0.952).
"""

from __future__ import annotations

from statistics import median
from typing import Literal, get_args

from tokenplane.sim.catalog_specs import DEFAULT_MEM_EFFICIENCY

MemoryType = Literal["hbm2", "hbm2e", "hbm3", "hbm3e", "gddr6", "gddr6x", "gddr7"]
MEMORY_TYPES: tuple[str, ...] = get_args(MemoryType)

# FluidX3D's FP32/FP32 bytes of memory traffic per lattice-cell update.
BYTES_PER_CELL = 153

# (card, memory type, measured FP32/FP32 MLUPs/s, datasheet GB/s) as the FluidX3D table lists them:
# every NVIDIA Ampere/Hopper/Ada/Blackwell GPU there but PG506-242/243 (see the module docstring).
FLUIDX3D: tuple[tuple[str, str, int, int], ...] = (
    ("B300 SXM6 AC", "hbm3e", 42519, 8000),
    ("B200 SXM6 180GB", "hbm3e", 42152, 8000),
    ("H200 SXM5 141GB", "hbm3e", 23056, 4800),
    ("GH200 94GB GPU", "hbm3", 20595, 4000),
    ("H100 NVL", "hbm3", 20303, 3938),
    ("H100 SXM5 80GB HBM3", "hbm3", 17602, 3350),
    ("H100 PCIe 80GB HBM2e", "hbm2e", 11128, 2000),
    ("A100 SXM4 80GB", "hbm2e", 10228, 2039),
    ("A100 PCIe 80GB", "hbm2e", 9657, 1935),
    ("A100 SXM4 40GB", "hbm2", 8522, 1555),
    ("A100 PCIe 40GB", "hbm2", 8526, 1555),
    ("CMP 170HX", "hbm2e", 7684, 1493),
    ("A30", "hbm2", 5004, 933),
    ("RTX PRO 6000 Blackwell", "gddr7", 10349, 1792),
    ("GeForce RTX 5090", "gddr7", 9522, 1792),
    ("GeForce RTX 5080", "gddr7", 5174, 960),
    ("GeForce RTX 5090M", "gddr7", 4830, 896),
    ("GeForce RTX 5070", "gddr7", 3658, 672),
    ("GeForce RTX 4090", "gddr6x", 5624, 1008),
    ("RTX 6000 Ada", "gddr6", 4997, 960),
    ("L40S", "gddr6", 3788, 864),
    ("L40", "gddr6", 3870, 864),
    ("GeForce RTX 4080 Super", "gddr6x", 4089, 736),
    ("GeForce RTX 4080", "gddr6x", 3914, 717),
    ("GeForce RTX 4070 Ti Super", "gddr6x", 3694, 672),
    ("GeForce RTX 4090M", "gddr6", 3367, 576),
    ("GeForce RTX 4070 Super", "gddr6x", 2751, 504),
    ("GeForce RTX 4070", "gddr6x", 2646, 504),
    ("GeForce RTX 4080M", "gddr6", 2577, 432),
    ("RTX 4000 Ada", "gddr6", 2130, 360),
    ("L4", "gddr6", 1490, 300),
    ("GeForce RTX 4060", "gddr6", 1614, 272),
    ("GeForce RTX 4070M", "gddr6", 1553, 256),
    ("RTX 2000 Ada", "gddr6", 1351, 224),
    ("GeForce RTX 3090 Ti", "gddr6x", 5717, 1008),
    ("GeForce RTX 3090", "gddr6x", 5418, 936),
    ("GeForce RTX 3080 Ti", "gddr6x", 5202, 912),
    ("GeForce RTX 3080 12GB", "gddr6x", 5071, 912),
    ("RTX A6000", "gddr6", 4421, 768),
    ("RTX A5000", "gddr6", 4414, 768),
    ("GeForce RTX 3080 10GB", "gddr6x", 4230, 760),
    ("A40", "gddr6", 3378, 696),
    ("GeForce RTX 3070 Ti", "gddr6x", 3490, 608),
    ("A10", "gddr6", 2931, 600),
    ("GeForce RTX 3080M Ti", "gddr6", 2985, 512),
    ("GeForce RTX 3070", "gddr6", 2578, 448),
    ("GeForce RTX 3060 Ti", "gddr6", 2644, 448),
    ("RTX A4000", "gddr6", 2500, 448),
    ("RTX A5000M", "gddr6", 2228, 448),
    ("GeForce RTX 3060", "gddr6", 2108, 360),
    ("GeForce RTX 3060M", "gddr6", 2019, 336),
    ("A16 (1 GPU)", "gddr6", 1031, 200),
    ("A2", "gddr6", 1031, 200),
    ("GeForce RTX 3050M Ti", "gddr6", 1181, 192),
    ("GeForce RTX 3050M", "gddr6", 1180, 192),
    ("GeForce RTX 3050 6GB", "gddr6", 993, 168),
)
# The chips of the documented mean (Vidur's profiles): A100 SXM4 80 GB and H100 SXM (HBM3).
REFERENCE_CARDS = ("A100 SXM4 80GB", "H100 SXM5 80GB HBM3")


def bandwidth_fraction(mlups: float, datasheet_gbps: float) -> float:
    """The fraction of its datasheet bandwidth a FluidX3D FP32/FP32 run of ``mlups`` reaches."""
    return mlups * BYTES_PER_CELL / (datasheet_gbps * 1000.0)


CARD_FRACTION: dict[str, float] = {c: bandwidth_fraction(m, bw) for c, _, m, bw in FLUIDX3D}
READ_FRACTION: dict[str, float] = {
    t: median(CARD_FRACTION[c] for c, ct, _, _ in FLUIDX3D if ct == t) for t in MEMORY_TYPES
}
REFERENCE_READ_FRACTION = sum(CARD_FRACTION[c] for c in REFERENCE_CARDS) / len(REFERENCE_CARDS)


def memory_type_ratio(memory_type: str | None) -> float:
    """How much more of its datasheet bandwidth ``memory_type`` reaches than the reference chips
    (1 for ``None``)."""
    if memory_type is None:
        return 1.0
    key = memory_type.strip().lower()
    if key not in MEMORY_TYPES:
        raise ValueError(f"unknown memory_type {memory_type!r}; one of {', '.join(MEMORY_TYPES)}")
    return READ_FRACTION[key] / REFERENCE_READ_FRACTION


def mem_efficiency_prior(memory_type: str | None) -> float:
    """The documented mean memory efficiency scaled by ``memory_type``'s ratio, at most 1."""
    return min(1.0, DEFAULT_MEM_EFFICIENCY * memory_type_ratio(memory_type))
