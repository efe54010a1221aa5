"""Prefill/decode pair routing: pick the (prefill, decode) pair a disaggregated request runs on.

With prefill/decode disaggregation a request is prefilled on one instance of the prefill pool, its
KV cache is transferred, and it decodes on one instance of the decode pool. The two choices want
different signals, so the policy scores each pool on its own and takes the best of each:

* prefill: ``prefill_load_weight`` x (1 - outstanding tokens / the pool's most; prefill work is
  the prompt tokens queued there) plus ``prefix_weight`` x the share of the prompt that instance
  holds in its KV cache (``RequestInfo.cached_prefix_tokens``, when the shell knows it: less to
  prefill);
* decode: ``kv_weight`` x the KV headroom left after this request's prompt and output
  (``kv_capacity_tokens x (1 - kv_usage) - prompt - max output``, over the capacity, clamped to
  [0, 1]: a decode instance must hold the transferred prompt, and one without room gates the
  request until it frees some) plus ``batch_weight`` x (1 - outstanding requests / the pool's
  most: a smaller running batch decodes each token faster).

Each score is the weighted mean of its terms, so it lies in [0, 1]; the highest wins, ties go to the
first candidate in the order given (deterministic). Only ``ready`` and ``healthy`` instances are
candidates. ``select_pair`` is pure: the policy keeps no state, so both shells (the twin and the
gateway) call the same object with their own views and get the same pair.

Params (``{name: pd-pair, params: {...}}``): ``prefill_load_weight``, ``prefix_weight``,
``kv_weight``, ``batch_weight`` (floats >= 0, default 1 each; each pool needs one positive).
Cost: one pass over each pool. How it fails: views lag what the shell has sent since they were
taken (the twin's views are exact; the gateway's ``outstanding_*`` are its own accounting).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

import msgspec

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.params import ParamReader
from tokenplane.core.registry import BuildContext, Family, PluginSpec, build, register
from tokenplane.core.views import InstanceId, InstanceView, RequestInfo


class PairReason(StrEnum):
    """Why a pair was (or was not) chosen; stable values, used as metric labels."""

    PAIRED = "pd_paired"
    NO_PREFILL = "no_prefill_instance"
    NO_DECODE = "no_decode_instance"


class PairDecision(msgspec.Struct, frozen=True):
    """The pair a request runs on (both ids, or neither), why, and each side's winning score."""

    prefill_id: InstanceId | None
    decode_id: InstanceId | None
    reason: PairReason
    prefill_score: float = 0.0
    decode_score: float = 0.0

    @property
    def routed(self) -> bool:
        return self.prefill_id is not None and self.decode_id is not None


@runtime_checkable
class PairRouter(Protocol):
    name: str

    def select_pair(
        self,
        request: RequestInfo,
        prefill: Sequence[InstanceView],
        decode: Sequence[InstanceView],
        *,
        now: float,
    ) -> PairDecision: ...


PAIR_ROUTERS: Family[PairRouter] = Family("pair-router", PairRouter)


def _clamp(x: float) -> float:
    return 0.0 if x < 0.0 else (1.0 if x > 1.0 else x)


def _eligible(views: Sequence[InstanceView]) -> list[InstanceView]:
    return [v for v in views if v.ready and v.healthy]


class PdPairRouter:
    name = "pd-pair"

    def __init__(
        self,
        prefill_load_weight: float = 1.0,
        prefix_weight: float = 1.0,
        kv_weight: float = 1.0,
        batch_weight: float = 1.0,
    ) -> None:
        weights = (prefill_load_weight, prefix_weight, kv_weight, batch_weight)
        if min(weights) < 0 or not all(math.isfinite(w) for w in weights):
            raise ValueError(f"weights must be finite and >= 0, got {weights}")
        if prefill_load_weight + prefix_weight <= 0 or kv_weight + batch_weight <= 0:
            raise ValueError("each pool needs a positive weight")
        self.prefill_load_weight = prefill_load_weight
        self.prefix_weight = prefix_weight
        self.kv_weight = kv_weight
        self.batch_weight = batch_weight

    def prefill_scores(self, request: RequestInfo, candidates: Sequence[InstanceView]) -> list[float]:
        """One score in [0, 1] per candidate (aligned with ``candidates``)."""
        most = max((v.outstanding_tokens for v in candidates), default=0)
        cached = request.cached_prefix_tokens
        prompt = max(1, request.prompt_tokens)
        wl, wp = self.prefill_load_weight, self.prefix_weight
        out = []
        for v in candidates:
            load = 1.0 - v.outstanding_tokens / most if most > 0 else 1.0
            hit = cached.get(v.instance_id, 0) / prompt if cached else 0.0
            out.append(_clamp((wl * _clamp(load) + wp * _clamp(hit)) / (wl + wp)))
        return out

    def decode_scores(self, request: RequestInfo, candidates: Sequence[InstanceView]) -> list[float]:
        """One score in [0, 1] per candidate (aligned with ``candidates``)."""
        most = max((v.outstanding_requests for v in candidates), default=0)
        need = request.prompt_tokens + request.max_output_tokens
        wk, wb = self.kv_weight, self.batch_weight
        out = []
        for v in candidates:
            cap = v.kv_capacity_tokens
            headroom = (cap * (1.0 - v.kv_usage) - need) / cap if cap > 0 else 0.0
            batch = 1.0 - v.outstanding_requests / most if most > 0 else 1.0
            out.append(_clamp((wk * _clamp(headroom) + wb * _clamp(batch)) / (wk + wb)))
        return out

    def select_pair(
        self,
        request: RequestInfo,
        prefill: Sequence[InstanceView],
        decode: Sequence[InstanceView],
        *,
        now: float,
    ) -> PairDecision:
        pre = _eligible(prefill)
        if not pre:
            return PairDecision(None, None, PairReason.NO_PREFILL)
        dec = _eligible(decode)
        if not dec:
            return PairDecision(None, None, PairReason.NO_DECODE)
        ps = self.prefill_scores(request, pre)
        ds = self.decode_scores(request, dec)
        pi = max(range(len(pre)), key=ps.__getitem__)  # max keeps the first of equal scores
        di = max(range(len(dec)), key=ds.__getitem__)
        return PairDecision(pre[pi].instance_id, dec[di].instance_id, PairReason.PAIRED, ps[pi], ds[di])


@register(PAIR_ROUTERS, "pd-pair")
def _build_pd_pair(params: Mapping[str, Any], ctx: BuildContext) -> PdPairRouter:
    r = ParamReader(
        "pair-router 'pd-pair'", params, ("prefill_load_weight", "prefix_weight", "kv_weight", "batch_weight")
    )
    return PdPairRouter(
        r.float_("prefill_load_weight", 1.0, min_value=0.0),
        r.float_("prefix_weight", 1.0, min_value=0.0),
        r.float_("kv_weight", 1.0, min_value=0.0),
        r.float_("batch_weight", 1.0, min_value=0.0),
    )


def build_pair_router(raw_config: Mapping[str, Any] | str, rng: random.Random | None = None) -> PairRouter:
    """Parse and build one pair router (``"pd-pair"`` or ``{name, params}``); fails with
    :class:`~tokenplane.core.errors.InvalidPolicyConfig` naming the plugin and the reason."""
    if rng is not None and not isinstance(rng, random.Random):
        raise InvalidPolicyConfig(f"build_pair_router needs a random.Random, got {type(rng).__name__}")
    spec = PluginSpec.parse(raw_config, default_kind=PAIR_ROUTERS.kind)
    return build(spec, BuildContext(rng or random.Random(0)), PAIR_ROUTERS)
