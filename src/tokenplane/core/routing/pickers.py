"""Pickers for weighted profiles (kind ``picker``): choose one candidate from the total scores.

* ``max-score``: the highest total; ties → the lowest candidate index (deterministic, stateless;
  ``max`` + ``index`` run in C). No params.
* ``random-top``: uniform among the ``top_k`` highest totals (param ``top_k``, int >= 1, default 2;
  clipped to the number of candidates). Ties at the cut-off keep the lower indices. Draws from the
  injected ``ctx.rng``, which advances it (an injected dependency, not policy state). Spreading
  over the top few damps the herding a strict argmax suffers when scores lag.

Cost: ``max-score`` O(n); ``random-top`` O(n log k). How they fail: ``max-score`` herds when
concurrent requests see the same stale scores; ``random-top`` sends some traffic to a worse
candidate by design.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Mapping, Sequence
from typing import Any

from tokenplane.core.params import ParamReader, no_params
from tokenplane.core.registry import BuildContext, register
from tokenplane.core.routing.base import PICKERS
from tokenplane.core.routing.random_choice import draw_index

DEFAULT_TOP_K = 2


class MaxScorePicker:
    name = "max-score"

    def pick(self, scores: Sequence[float]) -> int:
        return scores.index(max(scores))


class RandomTopPicker:
    name = "random-top"

    def __init__(self, rng: random.Random, top_k: int = DEFAULT_TOP_K) -> None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self._rng = rng
        self.top_k = top_k

    def pick(self, scores: Sequence[float]) -> int:
        n = len(scores)
        if self.top_k == 1 or n == 1:
            return scores.index(max(scores))
        top = heapq.nlargest(self.top_k, range(n), key=scores.__getitem__)
        return top[draw_index(self._rng, len(top))]


@register(PICKERS, "max-score")
def _build_max(params: Mapping[str, Any], ctx: BuildContext) -> MaxScorePicker:
    no_params("picker 'max-score'", params)
    return MaxScorePicker()


@register(PICKERS, "random-top")
def _build_random_top(params: Mapping[str, Any], ctx: BuildContext) -> RandomTopPicker:
    reader = ParamReader("picker 'random-top'", params, ("top_k",))
    return RandomTopPicker(ctx.rng, reader.int_("top_k", DEFAULT_TOP_K, min_value=1))
