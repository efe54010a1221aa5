"""Which run of a scenario is rehearsed, and at what size.

A rehearsal runs live in real time, so a scenario's run is cut down before either side runs it
(the twin runs the same cut-down run, so both sides see the same workload):

* ``scale`` multiplies the offered load: agentic ``users``, open-loop ``rate_rps``;
* ``instances`` replaces the fleet size (faults must name an instance that still exists);
* ``duration`` (open-loop workloads only) replaces the workload's arrival span and compresses the
  whole run in time by the same factor: the run's ``duration_s`` and every fault's times, so a
  fault keeps its place in the run.

What the live shell cannot rehearse is refused here with the reason, before anything starts.
"""

from __future__ import annotations

from typing import Any

from tokenplane.rehearse.errors import RehearsalError
from tokenplane.sim.scenario import RunSettings, Scenario

#: Load factor when none is given: the default scenario's 40 users become 10 (about 1.5 min live).
DEFAULT_SCALE = 0.25
OPEN_LOOP = ("synthetic", "bursty")
REHEARSED_FAULTS = ("slow", "lose")


def pick_run(scenario: Scenario, name: str | None) -> RunSettings:
    if name is None:
        return scenario.runs[0]
    for run in scenario.runs:
        if run.name == name:
            return run
    known = ", ".join(r.name for r in scenario.runs)
    raise RehearsalError(f"scenario {scenario.name!r} has no run {name!r}; its runs: {known}")


def rehearsal_run(
    run: RunSettings,
    *,
    scale: float = DEFAULT_SCALE,
    instances: int | None = None,
    duration: float | None = None,
) -> RunSettings:
    """``run`` cut to rehearsal size (see the module docstring); refuses what live cannot run."""
    if not scale > 0:
        raise RehearsalError(f"--scale must be positive, got {scale}")
    _check_supported(run)
    workload: dict[str, Any] = dict(run.workload)
    kind = workload.get("type", "synthetic")
    update: dict[str, Any] = {}
    if kind == "agentic":
        users = workload.get("users")
        if users is None:
            from tokenplane.sim.workloads.agentic import AGENTIC_PRESETS

            users = AGENTIC_PRESETS[workload.get("preset", "chat")]["users"]
        workload["users"] = max(1, round(int(users) * scale))
        if duration is not None:
            raise RehearsalError("--duration is for open-loop workloads; agentic runs end when users finish")
    elif kind in OPEN_LOOP:
        workload["rate_rps"] = float(workload.get("rate_rps", 1.0)) * scale
        if duration is not None:
            if not duration > 0:
                raise RehearsalError(f"--duration must be positive, got {duration}")
            span = workload.get("duration_s")
            if span is None:
                raise RehearsalError("--duration needs a workload with duration_s (its arrival span)")
            k = duration / float(span)
            workload["duration_s"] = duration
            workload.pop("num_requests", None)
            if run.duration_s is not None:
                update["duration_s"] = run.duration_s * k
            update["faults"] = [_compressed(f.model_dump(), k) for f in run.faults]
    else:
        raise RehearsalError(f"workload type {kind!r} is not rehearsed live (agentic, synthetic, bursty are)")
    update["workload"] = workload
    if instances is not None:
        if instances < 1:
            raise RehearsalError(f"--instances must be >= 1, got {instances}")
        update["fleet"] = run.fleet.model_copy(update={"instances": instances})
    out = RunSettings.model_validate({**run.model_dump(), **update})
    for f in out.faults:
        if f.instance >= out.fleet.instances:
            raise RehearsalError(f"a {f.kind} fault names instance {f.instance} of {out.fleet.instances}")
    return out


def _compressed(fault: dict[str, Any], k: float) -> dict[str, Any]:
    for key in ("at_s", "duration_s", "notice_s", "replace_after_s"):
        if fault.get(key) is not None:
            fault[key] = fault[key] * k
    return fault


def _check_supported(run: RunSettings) -> None:
    if run.fleet.groups is not None:
        raise RehearsalError("fleets of several groups are not rehearsed live (one GPU type and model)")
    if run.autoscaler is not None or run.admission is not None:
        raise RehearsalError("runs with an autoscaler or an admission policy are not rehearsed live")
    if run.fleet.engine.kind != "continuous":
        raise RehearsalError("the emulator runs the continuous engine only")
    if run.fleet.engine.block_size != 16:
        raise RehearsalError("the emulator's KV block is 16 tokens; the run's engine says otherwise")
    if run.fleet.engine.lora is not None or run.workload.get("adapters"):
        raise RehearsalError("LoRA adapters are not rehearsed live")
    for f in run.faults:
        if f.kind not in REHEARSED_FAULTS:
            raise RehearsalError(
                f"{f.kind} faults are not rehearsed live (only {', '.join(REHEARSED_FAULTS)})"
            )
