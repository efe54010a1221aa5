"""Where the public traces live: an explicit folder, ``$TOKENPLANE_TRACES``, or ``../shared/traces``.

The traces are never part of the repository; code and tests find them through :func:`traces_dir`
and fail (or skip) with a message that says how to point at them.
"""

from __future__ import annotations

import os
from pathlib import Path

from tokenplane.sim.errors import TraceNotFound

ENV_VAR = "TOKENPLANE_TRACES"

__all__ = ["ENV_VAR", "TraceNotFound", "require_trace", "traces_dir"]


def traces_dir(explicit: str | Path | None = None) -> Path | None:
    """The public traces folder, or ``None`` when there is none.

    In order: ``explicit`` (returned as given, even if missing, so a wrong path errors loudly later),
    the ``TOKENPLANE_TRACES`` environment variable (likewise), ``../shared/traces`` relative to the
    current working directory, then ``../shared/traces`` next to the repository this file lives in;
    the last two only if they exist.
    """
    if explicit is not None:
        return Path(explicit).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    from_cwd = Path.cwd() / ".." / "shared" / "traces"
    if from_cwd.is_dir():
        return from_cwd.resolve()
    # src/tokenplane/sim/workloads/traces.py -> parents[4] is the repository root.
    from_repo = Path(__file__).resolve().parents[4] / ".." / "shared" / "traces"
    if from_repo.is_dir():
        return from_repo.resolve()
    return None


def require_trace(relpath: str | Path, traces: Path | None) -> Path:
    """``traces / relpath`` (or ``relpath`` itself when absolute), raising :class:`TraceNotFound`."""
    rel = Path(relpath).expanduser()
    if rel.is_absolute():
        if not rel.exists():
            raise TraceNotFound(f"trace file {rel} does not exist")
        return rel
    if traces is None:
        raise TraceNotFound(
            f"trace {rel} is relative to the public traces folder, and no traces folder was found: "
            f"set {ENV_VAR}=/path/to/traces (or put the traces in ../shared/traces), or give an absolute path"
        )
    path = traces / rel
    if not path.exists():
        raise TraceNotFound(
            f"trace {path} does not exist (traces folder {traces}; "
            f"set {ENV_VAR} to the folder that holds {rel})"
        )
    return path
