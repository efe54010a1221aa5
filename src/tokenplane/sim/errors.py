"""Errors of the digital twin: inputs it cannot use, each also the builtin error it is a kind of.

Hierarchy::

    SimError                        base class of the twin's errors
    ├── ScenarioError               a scenario file cannot be read or does not validate
    │                               (also a ``ValueError``; the message names the field)
    ├── WorkloadConfigError         a workload config is malformed: unknown type, field or value
    │                               (also a ``ValueError``)
    ├── ValidationError             a measurement folder is missing, unreadable, or names hardware
    │                               the catalogue lacks (also a ``ValueError``)
    ├── TraceNotFound               a trace file, or the traces folder, is not there
    │                               (also a ``FileNotFoundError``)
    ├── UnknownHardware             a GPU or model name the catalogue does not know
    │                               (also a ``KeyError``; the message lists the known names)
    └── CatalogError                a catalogue entry or file is invalid (also a ``ValueError``)

Each class is re-exported where it was first defined (``sim.scenario``, ``sim.workloads.factory``,
``sim.validation``, ``sim.workloads.traces``, ``sim.catalog``), so imports from there keep working.
Expected outcomes of a run (a request shed, an instance lost) are records with reasons, never
exceptions.
"""

from __future__ import annotations

from collections.abc import Iterable


class SimError(Exception):
    """Base class of the twin's errors."""


class ScenarioError(SimError, ValueError):
    """A scenario file cannot be read or does not validate; the message names the field."""


class WorkloadConfigError(SimError, ValueError):
    """A workload config is malformed: unknown type, unknown field or bad value."""


class ValidationError(SimError, ValueError):
    """A measurement folder is missing, unreadable, or names hardware the catalogue lacks."""


class TraceNotFound(SimError, FileNotFoundError):
    """A trace file (or the traces folder itself) could not be found."""


class UnknownHardware(SimError, KeyError):
    """A GPU or model name the catalogue does not know; the message lists the known names."""

    def __init__(self, kind: str, name: str, known: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.known = sorted(known)
        super().__init__(f"unknown {kind} {name!r}; known {kind}s: {', '.join(self.known)}")

    def __str__(self) -> str:
        return str(self.args[0])


class CatalogError(SimError, ValueError):
    """Invalid catalogue configuration (bad field, bad type, unreadable YAML)."""
