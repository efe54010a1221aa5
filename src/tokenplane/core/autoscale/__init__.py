"""Autoscaling: decide pool sizes (serving, warm, cold starts, drains) from what the pool signals.

Importing this package registers the ``autoscaler`` plugins ``tokenplane``
(:class:`TokenplaneScaler`), ``hpa`` (:class:`HpaScaler`) and ``static`` (:class:`StaticFleet`);
:func:`build_autoscaler` builds one from its config slice. See :mod:`.base` for the loop a shell
runs, :mod:`.signals` for the inputs and the instance lifecycle, :mod:`.policy` for the algorithm.
"""

from tokenplane.core.autoscale.base import Autoscaler
from tokenplane.core.autoscale.baselines import HpaScaler, HpaState, StaticFleet
from tokenplane.core.autoscale.capacity import CapacityEstimate
from tokenplane.core.autoscale.decision import (
    ActionKind,
    Needs,
    ScaleAction,
    ScaleDecision,
    ScaleReason,
)
from tokenplane.core.autoscale.factory import build_autoscaler, parse_pool_spec
from tokenplane.core.autoscale.forecast import Forecast, holt_forecast
from tokenplane.core.autoscale.plan import plan_actions
from tokenplane.core.autoscale.policy import TokenplaneScaler
from tokenplane.core.autoscale.scaler_state import ScalerState
from tokenplane.core.autoscale.signals import PoolSignal, PoolSpec, RateSample
from tokenplane.core.autoscale.tokenplane_params import TokenplaneParams

__all__ = [
    "ActionKind",
    "Autoscaler",
    "CapacityEstimate",
    "Forecast",
    "HpaScaler",
    "HpaState",
    "Needs",
    "PoolSignal",
    "PoolSpec",
    "RateSample",
    "ScaleAction",
    "ScaleDecision",
    "ScaleReason",
    "ScalerState",
    "StaticFleet",
    "TokenplaneParams",
    "TokenplaneScaler",
    "build_autoscaler",
    "holt_forecast",
    "parse_pool_spec",
    "plan_actions",
]
