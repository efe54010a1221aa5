"""An emulated GPU instance: the twin's engine served in real time behind vLLM's API and metrics."""

from tokenplane.emulator.faults import Faults, FaultUpdate
from tokenplane.emulator.instance import EmulatedInstance, EmulatorSettings
from tokenplane.emulator.realtime import RealtimeClock
from tokenplane.emulator.server import create_app, instance_of, start_emulator

__all__ = [
    "EmulatedInstance",
    "EmulatorSettings",
    "FaultUpdate",
    "Faults",
    "RealtimeClock",
    "create_app",
    "instance_of",
    "start_emulator",
]
