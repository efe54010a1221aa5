"""The GPU catalogue: datasheet figures of the GPU types the placement plugins rank.

The GPU-aware plugins (``gpu-fit``, ``gpu-generation``, ``hbm-headroom``, ``tenant-priority``,
``latency-budget``) take a param ``gpus``, merged over :data:`DEFAULT_GPUS`::

    gpus: {h100: {generation: 9, hbm_gib: 80, bw_gbps: 3350, tflops: 989, price_per_hour: 2.99}, ...}

A new GPU needs at least ``generation``, ``hbm_gib`` and ``bw_gbps``; without ``tflops`` its FLOPs
are assumed to scale like its bandwidth against the reference GPU (an H100).

``InstanceView.gpu`` is matched case-insensitively, ignoring punctuation and a leading "nvidia" or
"geforce", by the longest catalogue name it starts with ("NVIDIA H100-SXM" → h100). An unknown GPU
is neutral in every plugin. Cost: a dict read per lookup; an alias walks the ≤ 10 catalogue names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.params import ParamReader

GIB = 1 << 30
REFERENCE_TFLOPS = 989.0  # H100 dense BF16: the GPU ``prefill_tokens_per_s`` is quoted for
REFERENCE_BW_GBPS = 3350.0  # H100 HBM3: the GPU ``queue_s_per_request`` is quoted for
_TFLOPS_PER_GBPS = REFERENCE_TFLOPS / REFERENCE_BW_GBPS


@dataclass(frozen=True, slots=True)
class GpuClass:
    """Datasheet figures of one GPU type: enough to rank speed and cost per token."""

    name: str
    generation: int  # architecture: 8 Ampere/Ada, 9 Hopper, 10 Blackwell
    hbm_gib: float
    bw_gbps: float
    tflops: float  # dense BF16
    price_per_hour: float = 0.0  # 0: unknown (the instance view's price is used when it has one)


# Datasheet figures; prices are typical 2025 on-demand rates (assumptions, as in the sim catalogue).
DEFAULT_GPUS: Mapping[str, GpuClass] = {
    g.name: g
    for g in (
        GpuClass("h100", 9, 80, 3350, 989, 2.99),
        GpuClass("h200", 9, 141, 4800, 989, 3.79),
        GpuClass("a100", 8, 80, 2039, 312, 1.79),
        GpuClass("l40s", 8, 48, 864, 362, 1.03),
        GpuClass("rtx4090", 8, 24, 1008, 165, 0.69),
        GpuClass("rtxpro6000", 10, 96, 1597, 504, 1.79),
    )
}


def _gpu_key(name: str) -> str:
    key = "".join(ch for ch in name.lower() if ch.isalnum())
    return key.removeprefix("nvidia").removeprefix("geforce")


class GpuCatalogue:
    """Name → :class:`GpuClass`, matched by normalised name or the longest catalogue prefix."""

    def __init__(self, gpus: Mapping[str, GpuClass]) -> None:
        self._by_key = {_gpu_key(name): g for name, g in gpus.items()}
        self._keys_longest_first = sorted(self._by_key, key=len, reverse=True)

    def lookup(self, gpu: str) -> GpuClass | None:
        if not gpu:
            return None
        key = _gpu_key(gpu)
        found = self._by_key.get(key)
        if found is not None:
            return found
        for k in self._keys_longest_first:
            if k and key.startswith(k):
                return self._by_key[k]
        return None

    @classmethod
    def from_params(cls, owner: str, raw: Any) -> GpuCatalogue:
        """Merge a ``gpus`` param over :data:`DEFAULT_GPUS`; ``None`` gives the defaults."""
        gpus = dict(DEFAULT_GPUS)
        if raw is None:
            return cls(gpus)
        if not isinstance(raw, Mapping):
            raise InvalidPolicyConfig(f"{owner}: param 'gpus' must be a mapping of GPU name to figures")
        fields = ("generation", "hbm_gib", "bw_gbps", "tflops", "price_per_hour")
        for name, figures in raw.items():
            where = f"{owner}: gpus.{name}"
            reader = ParamReader(where, figures, fields)
            base = gpus.get(str(name).lower())
            if base is None:
                missing = [f for f in ("generation", "hbm_gib", "bw_gbps") if not reader.has(f)]
                if missing:
                    raise InvalidPolicyConfig(f"{where}: a new GPU needs {missing}")
                base = GpuClass(str(name).lower(), 0, 0.0, 0.0, 0.0)
            bw = reader.float_("bw_gbps", base.bw_gbps, min_value=0.0, exclusive_min=True)
            gpus[base.name] = GpuClass(
                base.name,
                reader.int_("generation", base.generation, min_value=0),
                reader.float_("hbm_gib", base.hbm_gib, min_value=0.0, exclusive_min=True),
                bw,
                # without a figure, assume FLOPs scale like bandwidth against the reference GPU
                reader.float_("tflops", base.tflops or bw * _TFLOPS_PER_GBPS, min_value=0.0),
                reader.float_("price_per_hour", base.price_per_hour, min_value=0.0),
            )
        return cls(gpus)


def catalogue_param(reader: ParamReader) -> GpuCatalogue:
    """The catalogue of a plugin's ``gpus`` param (the defaults without one)."""
    return GpuCatalogue.from_params(reader.owner, reader.raw("gpus"))


def relative_speeds(specs: Sequence[GpuClass | None]) -> list[float]:
    """bw / max bw over the known GPUs; 1 for unknown ones (or when none is known)."""
    top = max((s.bw_gbps for s in specs if s is not None), default=0.0)
    if top <= 0:
        return [1.0] * len(specs)
    return [1.0 if s is None else s.bw_gbps / top for s in specs]
