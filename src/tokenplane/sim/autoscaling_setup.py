"""An autoscaled run at t = 0: its scaler and pool spec (pool defaults from the fleet), each
group's cold-start timings and price, and each instance's first lifecycle state.

Pool defaults come from the fleet: ``max_instances`` = the fleet's configured instances (the
maximum pool), ``cold_start_s``/``warm_activation_s`` = the slowest group's (what the scaler
plans with; the twin applies each instance's own), ``cost_per_instance_hour`` = the mean price,
``ttft_slo_s`` = the scenario's TTFT SLO. The pool's ``capacity_rps`` (one instance's sustainable
req/s for this traffic) is required: it is the prior the tokenplane scaler refines online.

Initial state: the first ``initial_serving`` instances of warm groups serve, the next
``warm_pool_size`` sit in the warm pool, the rest (and every ``state: cold`` group) are stopped.

The loop that then runs is :class:`tokenplane.sim.autoscaling.AutoscalingShell`.
"""

from __future__ import annotations

from typing import Any

from tokenplane.core.autoscale import Autoscaler, PoolSpec, build_autoscaler, parse_pool_spec
from tokenplane.sim.catalog import Catalog
from tokenplane.sim.lifecycle import SERVING, STOPPED, WARM, WARMING, Timings, cold_start_seconds
from tokenplane.sim.scenario import FleetGroup, RunSettings


def group_timings(group: FleetGroup, catalog: Catalog) -> Timings:
    lc = group.lifecycle
    cold = lc.cold_start_s
    if cold is None:
        cold = cold_start_seconds(
            catalog.model(group.model).weight_bytes, start_s=lc.start_s, load_gb_per_s=lc.load_gb_per_s
        )
    return Timings(cold_start_s=cold, warm_activation_s=lc.warm_activation_s)


def group_price(group: FleetGroup, catalog: Catalog) -> float:
    price = (
        group.price_per_hour if group.price_per_hour is not None else catalog.gpu(group.gpu).price_per_hour
    )
    return price * group.tp


def build_scaler_and_pool(run: RunSettings, catalog: Catalog) -> tuple[Autoscaler, PoolSpec]:
    """The run's autoscaler and pool spec, pool defaults filled from the fleet (see module doc)."""
    cfg = run.autoscaler
    if cfg is None:
        raise ValueError("the run has no autoscaler")
    groups = run.fleet.resolved_groups()
    timings = [group_timings(g, catalog) for g in groups]
    total = sum(g.instances for g in groups)
    price = sum(group_price(g, catalog) * g.instances for g in groups) / max(1, total)
    raw: dict[str, Any] = {
        "max_instances": total,
        "cold_start_s": max(t.cold_start_s for t in timings),
        "warm_activation_s": max(t.warm_activation_s for t in timings),
        "cost_per_instance_hour": price,
        "ttft_slo_s": run.slo.ttft_s,
        **cfg.pool,
    }
    spec = parse_pool_spec(raw, owner="autoscaler.pool")
    if spec.max_instances > total:
        raise ValueError(
            f"autoscaler.pool: max_instances {spec.max_instances} > the fleet's {total} instances"
        )
    scaler = build_autoscaler({"name": cfg.name, "params": cfg.params})
    return scaler, spec


def initial_states(run: RunSettings, spec: PoolSpec | None) -> list[str]:
    """Lifecycle state of each instance at t = 0 (fleet order)."""
    groups = run.fleet.resolved_groups()
    cfg = run.autoscaler
    if cfg is None or spec is None:
        return [WARMING if g.state == "cold" else SERVING for g in groups for _ in range(g.instances)]
    serving = cfg.initial_serving
    if serving is None:
        static = cfg.params.get("instances") if cfg.name == "static" else None
        serving = int(static) if static is not None else max(1, spec.min_instances)
    serving = min(serving, spec.max_instances)
    warm = min(spec.warm_pool_size, spec.max_instances - serving)
    states: list[str] = []
    for g in groups:
        for _ in range(g.instances):
            if g.state == "cold":
                states.append(STOPPED)
            elif serving > 0:
                states.append(SERVING)
                serving -= 1
            elif warm > 0:
                states.append(WARM)
                warm -= 1
            else:
                states.append(STOPPED)
    return states
