"""tokenplane: an inference control plane with a fleet digital twin."""

__version__ = "0.1.0"
