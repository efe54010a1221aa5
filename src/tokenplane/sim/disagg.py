"""Prefill/decode disaggregation in the twin: settings, the KV link, and the transfer time.

A disaggregated run splits its fleet into groups with ``role: prefill`` and ``role: decode``
(scenario key ``fleet.groups``) and names the pair policy and the link (scenario key
``disaggregation``)::

    disaggregation:
      pair: {name: pd-pair}              # core/routing/pd.py
      link: {preset: infiniband-ndr}     # or bandwidth_gb_per_s / latency_s of your own

A request is prefilled on a prefill instance (prompt plus one sampled token, as vLLM's proxy asks
with ``max_tokens: 1``), its prompt's KV cache is moved over the link in
``prompt tokens x the model's KV bytes per token / bandwidth + latency`` seconds, and it decodes on
the decode instance the pair policy chose, which must first hold free KV blocks for the prompt
(the request waits, gated, until it does). The client's first token is the decode instance's, as
in vLLM's disaggregated flow. :mod:`~tokenplane.sim.disagg_dispatch` carries this out.

Link presets (line rate per GPU, one direction; a real transfer gets less, so set
``bandwidth_gb_per_s`` to what you measure):

* ``infiniband-ndr`` (default): 50 GB/s, 400 Gb/s NDR, one ConnectX-7 port per GPU as in DGX H100
  (NVIDIA ConnectX-7 and DGX H100 datasheets); 5 us, a one-sided RDMA read through one switch
  (ConnectX-7: sub-microsecond adapter latency, Quantum-2 switch ~130 ns port to port; rounded up
  for the connector's request and completion).
* ``roce-400g``: 50 GB/s, 400 GbE RoCEv2 on the same NIC; 10 us (Ethernet switching and
  congestion control add to InfiniBand's figure; an order of magnitude, not a measurement).
* ``nvlink-h100``: 450 GB/s, NVLink 4 within one HGX H100 node (900 GB/s bidirectional per GPU,
  H100 SXM datasheet); 2 us.
* ``ethernet-100g``: 12.5 GB/s, a 100 GbE NIC (TCP); 20 us.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tokenplane.core.routing.pd import build_pair_router

# name -> (bandwidth GB/s, latency s); sources in the module docstring
LINK_PRESETS: dict[str, tuple[float, float]] = {
    "infiniband-ndr": (50.0, 5e-6),
    "roce-400g": (50.0, 10e-6),
    "nvlink-h100": (450.0, 2e-6),
    "ethernet-100g": (12.5, 20e-6),
}
DEFAULT_LINK = "infiniband-ndr"


class LinkSettings(BaseModel):
    """The KV link between a prefill and a decode instance: a preset, or either figure of your own
    (an explicit figure wins over the preset's)."""

    model_config = ConfigDict(extra="forbid")

    preset: str = DEFAULT_LINK
    bandwidth_gb_per_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    latency_s: float | None = Field(None, ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _check_preset(self) -> LinkSettings:
        if self.preset not in LINK_PRESETS:
            raise ValueError(f"unknown link preset {self.preset!r}; known: {', '.join(LINK_PRESETS)}")
        return self

    @property
    def bandwidth(self) -> float:
        """Bytes per second."""
        gb = self.bandwidth_gb_per_s if self.bandwidth_gb_per_s is not None else LINK_PRESETS[self.preset][0]
        return gb * 1e9

    @property
    def latency(self) -> float:
        return self.latency_s if self.latency_s is not None else LINK_PRESETS[self.preset][1]


class DisaggSettings(BaseModel):
    """Scenario key ``disaggregation`` (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    pair: Any = "pd-pair"
    link: LinkSettings = Field(default_factory=lambda: LinkSettings())


def transfer_seconds(tokens: int, kv_bytes_per_token: float, link: LinkSettings) -> float:
    """Time to move ``tokens`` tokens of KV cache over ``link``: bytes / bandwidth + latency."""
    return tokens * kv_bytes_per_token / link.bandwidth + link.latency


def check_disaggregation(roles: list[str], settings: DisaggSettings | None) -> None:
    """A disaggregated run needs prefill and decode groups and nothing else, and a pair policy that
    builds; others only ``mixed`` groups. Raises ``ValueError`` (or the core's InvalidPolicyConfig)."""
    if settings is not None:
        if "prefill" not in roles or "decode" not in roles or "mixed" in roles:
            raise ValueError(
                "disaggregation needs fleet.groups with role prefill and role decode (and no mixed)"
            )
        build_pair_router(settings.pair)
    elif any(r != "mixed" for r in roles):
        raise ValueError("groups with role prefill or decode need the run's disaggregation settings")
