"""The sweep file: its schema, the grid of its axes, and the scenario variant of each grid point.

A sweep file names a base scenario file and axes, each a dotted path into that scenario with a
list of values; the grid is every combination of the axes' values, and each grid point runs each
of the scenario's runs (or the ``runs`` listed), one **variant** per (point, run):

.. code-block:: yaml

    name: fleet-size
    scenario: ../examples/cascade.yaml   # relative to this file
    runs: [naive, controlled]            # default: every run of the scenario
    reference: no-fault                  # optional: each variant also gets ratios to this run
    set: {duration_s: 300}               # optional: fixed values for every variant (dotted paths too)
    axes:
      fleet.instances: [4, 8]
      workload.rate_rps: [60, 100, 140]
      faults.0.factor: [2, 5]            # list items by index
      runs.controlled.router: [least-requests, power-of-two]   # a run's own key, by run name
    heatmaps:
      - {x: workload.rate_rps, y: faults.0.factor, value: tail_goodput_vs_reference}

A path (in ``set`` and ``axes``) sets a key of the scenario file as written, before the runs'
overrides are merged: a run that overrides the same key (``faults: []`` in a fault-free
reference) keeps its own value.

Every variant's scenario is validated when the file is loaded (:func:`load_sweep`), so a bad value
fails before anything runs. :mod:`tokenplane.sim.sweep` runs the variants.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tokenplane.sim.scenario import ScenarioError, parse_scenario
from tokenplane.sim.yaml_file import read_yaml


class SweepError(ScenarioError):
    """A sweep file cannot be read, does not validate, or one of its variants is not a valid scenario."""


class HeatmapSpec(BaseModel):
    """One heat map: ``value`` over the grid of two axes, one panel per run and other-axes point."""

    model_config = ConfigDict(extra="forbid")

    x: str
    y: str
    value: str = "tail_goodput_vs_reference"


class SweepSpec(BaseModel):
    """A sweep file, validated (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    name: str = "sweep"
    description: str = ""
    scenario: str
    runs: list[str] | None = None
    reference: str | None = None
    set: dict[str, Any] = Field(default_factory=dict)
    axes: dict[str, list[Any]] = Field(min_length=1)
    tail_fraction: float = Field(0.2, gt=0, le=1)
    pareto: dict[str, str] = Field(default_factory=lambda: {"x": "gpu_cost_usd", "y": "slo_attainment"})
    heatmaps: list[HeatmapSpec] = Field(default_factory=list)
    base: dict[str, Any] = Field(default_factory=dict, exclude=True)  # the scenario file, as read
    source: str | None = None

    @field_validator("axes")
    @classmethod
    def _non_empty(cls, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for path, values in axes.items():
            if not values:
                raise ValueError(f"axis {path!r} has no values")
        return axes


@dataclass(frozen=True, slots=True)
class Variant:
    """One grid point and one run of it: what a worker needs, as plain data (it is pickled)."""

    index: int
    point: tuple[tuple[str, Any], ...]
    run: str
    scenario: dict[str, Any]
    source: str
    traces: str | None = None
    tail_fraction: float = 0.2


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and validate a sweep file and its base scenario; every variant is checked here, so a bad
    value fails before anything runs (with the variant's axis values in the message)."""
    p = Path(path)
    raw = read_yaml(p, SweepError)
    if not isinstance(raw, Mapping):
        raise SweepError(f"{p}: expected a mapping at the top level")
    try:
        spec = SweepSpec.model_validate({**raw, "source": str(p)})
    except ValidationError as exc:
        parts = [f"{'.'.join(str(x) for x in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()]
        raise SweepError(f"{p}: {'; '.join(parts)}") from exc
    base_path = (p.parent / spec.scenario).resolve()
    try:
        base = yaml.safe_load(base_path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SweepError(f"{p}: scenario: cannot read {base_path}: {exc}") from exc
    if not isinstance(base, Mapping):
        raise SweepError(f"{p}: scenario: {base_path} is not a mapping")
    spec.base = dict(base)
    spec.scenario = str(base_path)
    check_sweep(spec)
    return spec


def check_sweep(spec: SweepSpec) -> None:
    """Validate every variant's scenario, the run names, and the plots' axes and values."""
    where = spec.source or "sweep"
    names: list[str] | None = None
    for point in grid(spec):
        try:
            scenario = parse_scenario(apply_point(spec.base, point, spec.set), source=spec.scenario)
        except (ScenarioError, SweepError) as exc:
            raise SweepError(f"{where}: variant {_label(point)}: {exc}") from exc
        names = [r.name for r in scenario.runs]
    assert names is not None
    for run in [*(spec.runs or []), *([spec.reference] if spec.reference else [])]:
        if run not in names:
            raise SweepError(f"{where}: run {run!r} is not in the scenario (it has {names})")
    for i, hm in enumerate(spec.heatmaps):
        for axis in (hm.x, hm.y):
            if axis not in spec.axes:
                raise SweepError(f"{where}: heatmaps[{i}]: {axis!r} is not an axis ({list(spec.axes)})")
        if hm.value.endswith("_vs_reference") and spec.reference is None:
            raise SweepError(f"{where}: heatmaps[{i}]: {hm.value} needs a reference run")


def grid(spec: SweepSpec) -> Iterator[tuple[tuple[str, Any], ...]]:
    """Every combination of the axes' values, the last axis fastest."""
    paths = list(spec.axes)
    for values in itertools.product(*(spec.axes[p] for p in paths)):
        yield tuple(zip(paths, values, strict=True))


def set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    """Set ``path`` (dotted; integers index lists; ``runs.NAME`` is the run named NAME) in ``doc``.

    Missing mapping keys on the way are created; a missing list item or run is an error.
    """
    parts = path.split(".")
    node: Any = doc
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if i > 0 and parts[i - 1] == "runs" and not part.isdigit():
                match = [r for r in node if isinstance(r, dict) and r.get("name") == part]
                if not match:
                    raise SweepError(f"axis {path!r}: no run named {part!r}")
                idx = node.index(match[0])
            elif part.isdigit() and int(part) < len(node):
                idx = int(part)
            else:
                raise SweepError(f"axis {path!r}: {part!r} is not an item of a {len(node)}-item list")
            if last:
                node[idx] = copy.deepcopy(value)
                return
            node = node[idx]
        elif isinstance(node, dict):
            if last:
                node[part] = copy.deepcopy(value)
                return
            if not isinstance(node.get(part), (dict, list)):
                node[part] = {}
            node = node[part]
        else:
            raise SweepError(f"axis {path!r}: cannot go into {type(node).__name__} at {part!r}")


def apply_point(
    base: Mapping[str, Any], point: Sequence[tuple[str, Any]], fixed: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The scenario file of one grid point: ``fixed`` (the sweep's ``set``), then the point's values."""
    doc = copy.deepcopy(dict(base))
    for path, value in [*(fixed or {}).items(), *point]:
        set_path(doc, path, value)
    return doc


def expand(spec: SweepSpec, *, traces: str | Path | None = None) -> list[Variant]:
    """The sweep's variants in grid order (each point's runs in the scenario's order)."""
    out: list[Variant] = []
    for point in grid(spec):
        doc = apply_point(spec.base, point, spec.set)
        names = [r.name for r in parse_scenario(doc, source=spec.scenario).runs]
        wanted = names if spec.runs is None else [n for n in names if n in spec.runs or n == spec.reference]
        for run in wanted:
            out.append(
                Variant(
                    index=len(out),
                    point=point,
                    run=run,
                    scenario=doc,
                    source=spec.scenario,
                    traces=None if traces is None else str(traces),
                    tail_fraction=spec.tail_fraction,
                )
            )
    return out


def _label(point: Sequence[tuple[str, Any]]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point)
