"""Workload sources: public trace readers, synthetic arrival processes, agentic users."""

from tokenplane.sim.workloads.agentic import AGENTIC_PRESETS, AgenticWorkload
from tokenplane.sim.workloads.azure import AzureTrace
from tokenplane.sim.workloads.base import RequestSpec, Workload
from tokenplane.sim.workloads.bursty import BurstyWorkload
from tokenplane.sim.workloads.dists import IntDist, LengthDist, interarrival_sampler, weibull_shape_for_cv
from tokenplane.sim.workloads.factory import WorkloadConfigError, build_workload
from tokenplane.sim.workloads.mooncake import MooncakeTrace
from tokenplane.sim.workloads.servegen import ServeGenWorkload
from tokenplane.sim.workloads.synthetic import SyntheticWorkload
from tokenplane.sim.workloads.traces import TraceNotFound, require_trace, traces_dir

__all__ = [
    "AGENTIC_PRESETS",
    "AgenticWorkload",
    "AzureTrace",
    "BurstyWorkload",
    "IntDist",
    "LengthDist",
    "MooncakeTrace",
    "RequestSpec",
    "ServeGenWorkload",
    "SyntheticWorkload",
    "TraceNotFound",
    "Workload",
    "WorkloadConfigError",
    "build_workload",
    "interarrival_sampler",
    "require_trace",
    "traces_dir",
    "weibull_shape_for_cv",
]
