"""Moved to :mod:`tokenplane.core.params`; this name stays for the modules that still import it."""

from tokenplane.core.params import ParamReader, no_params

__all__ = ["ParamReader", "no_params"]
