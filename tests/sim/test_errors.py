"""The twin's error tree lives in sim/errors.py; the modules that raise keep exporting their names."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenplane.sim import errors
from tokenplane.sim.catalog import Catalog, CatalogError, UnknownHardware
from tokenplane.sim.scenario import ScenarioError, load_scenario
from tokenplane.sim.validation import ValidationError
from tokenplane.sim.workloads.factory import WorkloadConfigError, build_workload
from tokenplane.sim.workloads.traces import TraceNotFound, require_trace


def test_one_tree_and_the_old_names_are_the_same_classes() -> None:
    assert ScenarioError is errors.ScenarioError and issubclass(ScenarioError, ValueError)
    assert WorkloadConfigError is errors.WorkloadConfigError and issubclass(WorkloadConfigError, ValueError)
    assert ValidationError is errors.ValidationError and issubclass(ValidationError, ValueError)
    assert TraceNotFound is errors.TraceNotFound and issubclass(TraceNotFound, FileNotFoundError)
    assert UnknownHardware is errors.UnknownHardware and issubclass(UnknownHardware, KeyError)
    assert CatalogError is errors.CatalogError and issubclass(CatalogError, ValueError)
    for cls in (
        ScenarioError,
        WorkloadConfigError,
        ValidationError,
        TraceNotFound,
        UnknownHardware,
        CatalogError,
    ):
        assert issubclass(cls, errors.SimError)
        assert cls.__name__ in (errors.__doc__ or "")


def test_each_is_raised_as_a_sim_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- not a mapping\n")
    with pytest.raises(errors.SimError, match="mapping"):
        load_scenario(bad)
    with pytest.raises(errors.SimError, match="no-such-workload"):
        build_workload({"type": "no-such-workload"}, traces=None, seed=0)
    with pytest.raises(errors.SimError):
        require_trace("no-such-trace.jsonl", tmp_path)
    with pytest.raises(errors.SimError, match="unknown gpu"):
        Catalog.default().gpu("no-such-gpu")
