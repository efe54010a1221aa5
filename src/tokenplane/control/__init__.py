"""The live control loop: the core autoscaler, run beside the gateway, acting on a real fleet.

* :mod:`.loop`: :class:`ControlLoop` (observe → decide → act → commit every ``interval_s``);
* :mod:`.actuators`: the :class:`Actuator` protocol, :class:`CommandActuator`,
  :class:`DryRunActuator`; :mod:`.emulated`: :class:`EmulatedFleetActuator`; :mod:`.k8s`:
  :class:`KubernetesActuator` (needs the ``k8s`` extra, imported lazily);
* :mod:`.signals`: :class:`SignalSource` and its two implementations; :mod:`.registry`: the
  :class:`PoolRegistry` the gateway implements;
* :mod:`.config`: the ``autoscaling:`` config section; :mod:`.metrics`: :class:`LoopMetrics`.

Wiring into the gateway (``tokenplane serve``), per pool:

* the gateway implements :class:`PoolRegistry` over its ``UpstreamPool``: ``add(url, id)`` builds an
  ``Upstream`` from an ``InstanceConfig(id=id, url=url, model=<pool model>, kind="emulated"|...)``
  and indexes it by id and model; ``drain(id)`` marks it so ``Gateway.route`` no longer offers it
  (the view stays listed); ``remove(id)`` drops it (and tells the router to ``forget`` it);
* a :class:`InProcessSignalSource` over ``[u.view() for u in pool.for_model(model)]`` (draining
  ones included), the model's admission queue depth, and a :class:`PoolStats` fed on the request
  path (``arrival`` when a request is described, ``first_token`` with its TTFT, ``finished``).
"""

from tokenplane.control.actuators import (
    Actuator,
    CommandActuator,
    CommandResult,
    DryRunActuator,
    InstanceHandle,
    InstanceState,
)
from tokenplane.control.config import (
    AutoscalingConfig,
    build_actuator,
    parse_autoscaling_config,
)
from tokenplane.control.emulated import EmulatedFleetActuator
from tokenplane.control.errors import (
    ActuatorError,
    AutoscalingConfigError,
    CommandFailed,
    ControlError,
    ScaleApiError,
)
from tokenplane.control.loop import ControlLoop, LoopEvent, Phase
from tokenplane.control.metrics import LoopMetrics
from tokenplane.control.registry import DryRunRegistry, InMemoryPoolRegistry, PoolRegistry
from tokenplane.control.signals import (
    GatewaySignalSource,
    InProcessSignalSource,
    PoolStats,
    SignalSample,
    SignalSource,
)

__all__ = [
    "Actuator",
    "ActuatorError",
    "AutoscalingConfig",
    "AutoscalingConfigError",
    "CommandActuator",
    "CommandFailed",
    "CommandResult",
    "ControlError",
    "ControlLoop",
    "DryRunActuator",
    "DryRunRegistry",
    "EmulatedFleetActuator",
    "GatewaySignalSource",
    "InMemoryPoolRegistry",
    "InProcessSignalSource",
    "InstanceHandle",
    "InstanceState",
    "LoopEvent",
    "LoopMetrics",
    "Phase",
    "PoolRegistry",
    "PoolStats",
    "ScaleApiError",
    "SignalSample",
    "SignalSource",
    "build_actuator",
    "parse_autoscaling_config",
]
