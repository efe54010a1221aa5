"""A GPU's measured BF16 matmul throughput as a prior for its compute efficiency
(``GpuSpec.compute_efficiency``).

``compute_efficiency`` is the fraction of the datasheet dense BF16 TFLOP/s that the step-time
model's GEMMs reach. For GPUs without a kernel profile it defaults to the mean of the H100 and A100
fits on Vidur's profiles (:mod:`tokenplane.sim.catalog_specs`). That mean hides two things that
differ between cards: how far the card's clock sits from the one its datasheet figure assumes
under a sustained matmul (a 700 W H100 throttles below its boost clock; a GeForce card with
half-rate FP32-accumulate tensor cores holds or passes its rated boost), and the serving
kernels' loss against a large, well-shaped matmul. This module transfers only the second from the
Vidur fits and takes the first from one public benchmark run the same way on every card::

    prior = DEFAULT_COMPUTE_EFFICIENCY * (matmul_tflops / bf16_tflops) / REFERENCE_MATMUL_FRACTION

where ``matmul_tflops`` is the card's best BF16 ``torch.matmul`` throughput in that benchmark and
``REFERENCE_MATMUL_FRACTION`` the same fraction for the chips the mean was fitted on.

Source: zzc0721/torch-performance-test-data, ``database.md`` (contributors' runs of one script,
``test.py``: square BF16 ``torch.matmul`` at 1024..10240, best size reported), BF16 column:

===========================================  ==================================  ==========
card                                         TFLOP/s measured / datasheet         fraction
===========================================  ==================================  ==========
A100 SXM4 80 GB (reference)                  264.53 / 312                         0.848
H100 80 GB HBM3 (reference; two runs)        789.24, 783.66 / 989                 0.795
RTX 4090 24 GB (four runs)                   170.06, 173.31, 162.39, 163.09        1.012
                                             (mean 167.21) / 165.2
RTX PRO 6000 Blackwell Server Edition        409.42 / 504                         0.812
RTX PRO 6000 Blackwell Workstation Edition   417.98 / 504                         0.829
===========================================  ==================================  ==========

(``database.md`` also lists modified 48 GB RTX 4090s, 160.5 to 167.7, and an A100 40 GB in an older
PyTorch, 246.3; they are not used.) The reference is the mean of the A100 SXM4 80 GB and the H100
SXM fractions: 0.822; Vidur's fits on those chips (0.718, 0.685) are 0.85 and 0.86 of them, the
kernel loss carried over.

How it fails: a square matmul is not the serving step's GEMM mix (Llama shapes, a few thousand
tokens, elementwise kernels between them), and the benchmark runs are single, uncontrolled
contributor runs (the four 4090 runs span 162 to 173, +/- 3 %). The ratio assumes the kernel loss
is the same fraction on every card. An entry's own ``compute_efficiency`` always wins over this
prior.
"""

from __future__ import annotations

from tokenplane.sim.catalog_specs import DEFAULT_COMPUTE_EFFICIENCY

# zzc0721/torch-performance-test-data database.md, BF16 torch.matmul TFLOP/s (see the docstring).
A100_SXM_MATMUL_TFLOPS = 264.53  # datasheet 312
H100_SXM_MATMUL_TFLOPS = (789.24 + 783.66) / 2  # datasheet 989
REFERENCE_MATMUL_FRACTION = (A100_SXM_MATMUL_TFLOPS / 312 + H100_SXM_MATMUL_TFLOPS / 989) / 2
# Published figures for cards without a Vidur profile (name: (matmul TFLOP/s, datasheet TFLOP/s)).
PUBLISHED_MATMUL_TFLOPS: dict[str, tuple[float, float]] = {
    "rtx4090": ((170.06 + 173.31 + 162.39 + 163.09) / 4, 165.2),
    "rtxpro6000": (409.42, 504.0),  # Server Edition, the shared run's card
    "rtxpro6000-workstation": (417.98, 504.0),
}


def matmul_ratio(matmul_tflops: float, bf16_tflops: float) -> float:
    """How much more of its datasheet a card's measured matmul reaches than the reference chips'."""
    if matmul_tflops <= 0 or bf16_tflops <= 0:
        raise ValueError(f"TFLOP/s must be positive, got {matmul_tflops} of {bf16_tflops}")
    return matmul_tflops / bf16_tflops / REFERENCE_MATMUL_FRACTION


def compute_efficiency_prior(matmul_tflops: float, bf16_tflops: float) -> float:
    """The documented mean compute efficiency scaled by the card's matmul ratio, at most 1."""
    return min(1.0, DEFAULT_COMPUTE_EFFICIENCY * matmul_ratio(matmul_tflops, bf16_tflops))
