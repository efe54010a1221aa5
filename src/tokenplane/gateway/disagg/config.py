"""The disaggregated pool kind in the gateway config: ``models[].pool`` and ``instances[].role``.

::

    models:
      - {name: llama-3-8b, pool: {kind: disaggregated, pair_router: pd-pair}}
    instances:
      - {id: p0, url: http://127.0.0.1:8001, model: llama-3-8b, kind: vllm, role: prefill}
      - {id: d0, url: http://127.0.0.1:8002, model: llama-3-8b, kind: vllm, role: decode}

A ``colocated`` pool (the default) serves each request on one instance. A ``disaggregated`` pool
prefills on a ``prefill`` instance and decodes on a ``decode`` one (``both``: either side), the pair
chosen by ``pair_router`` (the core's :mod:`~tokenplane.core.routing.pd`). Instances of a
disaggregated pool must speak vLLM's KV-transfer protocol (kinds ``vllm`` and ``emulated``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.routing import build_pair_router

InstanceRole = Literal["both", "prefill", "decode"]
DEFAULT_PAIR_ROUTER = "pd-pair"
DEFAULT_PREFILL_TIMEOUT_S = 120.0


class PoolConfig(BaseModel):
    """How a model's pool serves a request (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["colocated", "disaggregated"] = "colocated"
    pair_router: str | dict[str, Any] = DEFAULT_PAIR_ROUTER
    """The core pair router (``pd-pair`` and its params) that picks (prefill, decode)."""
    prefill_timeout_s: float = Field(DEFAULT_PREFILL_TIMEOUT_S, gt=0)
    """A prefill instance that has not answered by then is failed over (another prefill instance)."""
    colocated_fallback: bool = True
    """With no prefill instance available, a decode instance serves the request whole (it prefills
    the prompt itself, as vLLM does without KV-transfer parameters)."""

    @property
    def disaggregated(self) -> bool:
        return self.kind == "disaggregated"

    @field_validator("pair_router")
    @classmethod
    def _buildable(cls, router: str | dict[str, Any]) -> str | dict[str, Any]:
        try:
            build_pair_router(router, random.Random(0))
        except InvalidPolicyConfig as exc:
            raise ValueError(str(exc)) from None
        return router


class _Model(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def pool(self) -> PoolConfig: ...


class _Instance(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def role(self) -> InstanceRole: ...


def check_pools(models: Sequence[_Model], instances: Sequence[_Instance], *, static: bool) -> None:
    """``ValueError`` naming the field when instances' roles do not fit their model's pool kind."""
    from tokenplane.gateway.runtimes import PD_RUNTIMES  # the adapters import no config

    kinds = {m.name: m.pool.kind for m in models}
    sides: dict[str, set[str]] = {m.name: set() for m in models if m.pool.disaggregated}
    for i, inst in enumerate(instances):
        pool = kinds.get(inst.model)
        if pool is None:
            continue
        if pool == "colocated" and inst.role != "both":
            raise ValueError(
                f"instances[{i}].role: {inst.role!r} needs model {inst.model!r} to have "
                "pool: {kind: disaggregated}"
            )
        if pool == "disaggregated":
            if str(inst.kind) not in PD_RUNTIMES:
                raise ValueError(
                    f"instances[{i}].kind: a {inst.kind} instance cannot serve a disaggregated pool "
                    f"(KV transfer needs one of: {', '.join(PD_RUNTIMES)})"
                )
            sides[inst.model].update(("prefill", "decode") if inst.role == "both" else (inst.role,))
    if static:
        for name, have in sides.items():
            for side in ("prefill", "decode"):
                if side not in have:
                    raise ValueError(f"models: disaggregated model {name!r} has no {side} instance")


__all__ = ["DEFAULT_PAIR_ROUTER", "InstanceRole", "PoolConfig", "check_pools"]
