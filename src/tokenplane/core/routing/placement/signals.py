"""What the placement plugins read from the views, and the urgency several axes share.

Signals. Most come from typed fields of the views; an operator can also set some as instance
labels in the gateway's config (``labels:`` of an instance), read when the typed field holds its
default:

* ``InstanceView.weights`` ("warm" | "warming" | "cold"; also "loaded"/"ready", "loading",
  "unloaded"; label ``weights_state``), ``hbm_free_bytes`` (label ``hbm_free_gib``),
  ``predicted_ttft_s`` (label ``predicted_ttft_s``); label ``gpu_generation`` (overrides the
  catalogue; there is no typed field for it);
* ``RequestInfo.latency_budget_s`` (a TTFT budget counted from ``arrival_s``);
  ``WorkflowContext.deadline_s`` is an absolute time on the shell's clock
  (the clock of ``now``).

NaN and infinite reports are ignored (an unknown signal), and a label that does not parse as a
number is ignored too.

Urgency. Several axes depend on how much latency a request can tolerate, ``u`` in [0, 1]: from the
remaining budget ``b`` (the smaller of the request's TTFT budget left and its workflow's time left
divided by its steps left), ``u = 1`` for ``b <= interactive_s`` (default 1 s), ``0`` for
``b >= relaxed_s`` (60 s), log-linear between; without any budget, from ``priority`` (1 interactive
→ 1, 0 standard → 0.5, -1 batch → 0).
"""

from __future__ import annotations

import math
from typing import Any

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.params import ParamReader
from tokenplane.core.routing.placement.catalogue import GIB, GpuCatalogue
from tokenplane.core.views import InstanceView, RequestInfo

DEFAULT_INTERACTIVE_S = 1.0
DEFAULT_RELAXED_S = 60.0

WARM, WARMING, COLD = "warm", "warming", "cold"
_WEIGHT_STATES = {
    "warm": WARM,
    "loaded": WARM,
    "ready": WARM,
    "warming": WARMING,
    "loading": WARMING,
    "cold": COLD,
    "unloaded": COLD,
}


def _finite(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    f = float(x)
    return f if math.isfinite(f) else None


def _label_float(view: InstanceView, key: str) -> float | None:
    raw = view.labels.get(key)
    if raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def clamp01(x: float) -> float:
    return x if 0.0 <= x <= 1.0 else (1.0 if x > 1.0 else 0.0)  # NaN -> 0


def weights_state(view: InstanceView) -> str:
    """``warm`` | ``warming`` | ``cold``: the ``weights`` field, else label ``weights_state``.

    Unknown words read as warm: a misspelt state must not take an instance out of service.
    """
    typed = view.weights
    if typed and typed.lower() != WARM:
        return _WEIGHT_STATES.get(typed.lower(), WARM)
    label = view.labels.get("weights_state")
    if label:
        return _WEIGHT_STATES.get(label.lower(), WARM)
    return WARM


def gpu_generation(view: InstanceView, catalogue: GpuCatalogue) -> int | None:
    """Label ``gpu_generation``, else the catalogue's figure for ``view.gpu``; None when unknown."""
    label = _label_float(view, "gpu_generation")
    if label is not None:
        return int(label)
    spec = catalogue.lookup(view.gpu)
    return None if spec is None else spec.generation


def hbm_free_bytes(view: InstanceView) -> float | None:
    """``hbm_free_bytes`` when reported (> 0), else label ``hbm_free_gib``; None when unknown."""
    typed = _finite(view.hbm_free_bytes)
    if typed is not None and typed > 0:
        return typed
    gib = _label_float(view, "hbm_free_gib")
    return None if gib is None else max(0.0, gib) * GIB


def predicted_ttft_s(view: InstanceView) -> float | None:
    """The shell's TTFT prediction (> 0), else label ``predicted_ttft_s``; None when unknown."""
    typed = _finite(view.predicted_ttft_s)
    if typed is not None and typed > 0:
        return typed
    label = _label_float(view, "predicted_ttft_s")
    return None if label is None or label < 0 else label


def kv_tokens_needed(request: RequestInfo) -> int:
    return max(0, request.prompt_tokens) + max(0, request.max_output_tokens)


def could_ever_hold(view: InstanceView, tokens: int) -> bool:
    """Whether the instance's whole KV capacity could hold ``tokens`` (unknown capacity: yes)."""
    return view.kv_capacity_tokens <= 0 or view.kv_capacity_tokens >= tokens


def free_kv_tokens(view: InstanceView) -> float | None:
    """``(1 − kv_usage) × kv_capacity_tokens``; None when the capacity is unknown; NaN usage = full."""
    cap = view.kv_capacity_tokens
    if cap <= 0:
        return None
    return (1.0 - clamp01(view.kv_usage if not math.isnan(view.kv_usage) else 1.0)) * cap


def remaining_budget_s(request: RequestInfo, now: float) -> float | None:
    """Time left for this request's first token: the smaller of its TTFT budget left and its
    workflow's time left divided by its steps left (this one included); None without either."""
    best: float | None = None
    budget = _finite(request.latency_budget_s)
    if budget is not None:
        best = request.arrival_s + budget - now
    wf = request.workflow
    if wf is not None and wf.deadline_s is not None and math.isfinite(wf.deadline_s):
        steps_left = 1
        if wf.total_steps is not None:
            steps_left = max(1, wf.total_steps - wf.step + 1)
        share = (wf.deadline_s - now) / steps_left
        best = share if best is None else min(best, share)
    return best


def importance(request: RequestInfo) -> float:
    """Priority class onto [0, 1]: batch (≤ -1) 0, standard 0.5, interactive (≥ 1) 1."""
    return (min(1, max(-1, request.priority)) + 1) / 2


def urgency(request: RequestInfo, now: float, interactive_s: float, relaxed_s: float) -> float:
    """How latency-sensitive the request is, in [0, 1] (see the module docstring)."""
    b = remaining_budget_s(request, now)
    if b is None:
        return importance(request)
    if b <= interactive_s:
        return 1.0
    if b >= relaxed_s:
        return 0.0
    return clamp01(1.0 - math.log(b / interactive_s) / math.log(relaxed_s / interactive_s))


def urgency_params(reader: ParamReader) -> tuple[float, float]:
    """``interactive_s`` and ``relaxed_s`` of a plugin's params (validated: relaxed > interactive)."""
    interactive = reader.float_("interactive_s", DEFAULT_INTERACTIVE_S, min_value=0.0, exclusive_min=True)
    relaxed = reader.float_("relaxed_s", DEFAULT_RELAXED_S, min_value=0.0, exclusive_min=True)
    if not relaxed > interactive:
        raise InvalidPolicyConfig(f"{reader.owner}: relaxed_s must be > interactive_s")
    return interactive, relaxed
