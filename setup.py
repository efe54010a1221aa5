"""The build, pure Python by default; ``TOKENPLANE_COMPILE=1`` compiles the request path with mypyc.

Everything else (metadata, dependencies, packages) is in ``pyproject.toml``. The compiled build is
what mypy and black ship: the same source, type-checked, turned into C extension modules that run
the gateway's per-request work in fewer instructions (``bench/gateway_overhead.py`` measures it
against the pure build side by side). It needs a C compiler and mypy at build time, and is meant
for a non-editable install (``scripts/build-compiled.sh``): in an editable one the extension
modules would sit beside the sources and shadow every later edit of them.
"""

from __future__ import annotations

import os
import sys

from setuptools import setup

# The modules on the gateway's request path (a completion, JSON or stream): each request runs
# code in all of them. A module here must keep to what mypyc compiles faithfully (CONTRIBUTING.md,
# "The compiled build", says why each rule exists and how to build and test):
# - no class that an interpreted one subclasses or patches (or mark it
#   ``@mypyc_attr(allow_interpreted_subclasses=True)``, as ``ledger.store.BaseLedger``);
# - no ``runtime_checkable`` protocol;
# - no msgspec struct that is decoded into: mypyc hides union annotations from msgspec, so such
#   structs live in ``gateway/wire.py``, which stays interpreted;
# - no ``await`` inside an ``except`` block that then re-raises: compiled, it corrupted memory
#   (see ``StreamSplicer.relay``);
# - one name per exception type across a ``try``'s ``except`` clauses.
# CI runs the tests against this build (tests/test_compiled.py checks that they do).
COMPILED_MODULES = [
    "tokenplane/core/admission.py",
    "tokenplane/core/admission_backlog.py",
    "tokenplane/core/admission_decision.py",
    "tokenplane/core/admission_params.py",
    "tokenplane/core/breaker.py",
    "tokenplane/core/breaker_config.py",
    "tokenplane/core/breaker_states.py",
    "tokenplane/core/economics.py",
    "tokenplane/core/priority.py",
    "tokenplane/core/prompt_hash.py",
    "tokenplane/core/retry_budget.py",
    "tokenplane/core/shedding.py",
    "tokenplane/core/state_store.py",
    "tokenplane/core/timed_series.py",
    "tokenplane/core/routing/prefix_affinity.py",
    "tokenplane/core/routing/prefix_index.py",
    "tokenplane/gateway/admission.py",
    "tokenplane/gateway/app.py",
    "tokenplane/gateway/catalog.py",
    "tokenplane/gateway/check_rounds.py",
    "tokenplane/gateway/continuation.py",
    "tokenplane/gateway/economics.py",
    "tokenplane/gateway/edges/aiohttp_edge.py",
    "tokenplane/gateway/edges/chunked.py",
    "tokenplane/gateway/edges/fast_front.py",
    "tokenplane/gateway/edges/fast_request.py",
    "tokenplane/gateway/errors.py",
    "tokenplane/gateway/header_memo.py",
    "tokenplane/gateway/lean_metrics.py",
    "tokenplane/gateway/path_metrics.py",
    "tokenplane/gateway/proxy.py",
    "tokenplane/gateway/request.py",
    "tokenplane/gateway/resilience.py",
    "tokenplane/gateway/runtimes/base.py",
    "tokenplane/gateway/stages/admission.py",
    "tokenplane/gateway/stages/attempt.py",
    "tokenplane/gateway/stages/authenticate.py",
    "tokenplane/gateway/stages/cache.py",
    "tokenplane/gateway/stages/context.py",
    "tokenplane/gateway/stages/deferral.py",
    "tokenplane/gateway/stages/fallback.py",
    "tokenplane/gateway/stages/forward.py",
    "tokenplane/gateway/stages/limits.py",
    "tokenplane/gateway/stages/parse.py",
    "tokenplane/gateway/stages/pipeline.py",
    "tokenplane/gateway/stages/respond.py",
    "tokenplane/gateway/stages/working_set.py",
    "tokenplane/gateway/state.py",
    "tokenplane/gateway/tenants.py",
    "tokenplane/gateway/transports/aiohttp_transport.py",
    "tokenplane/gateway/transports/base.py",
    "tokenplane/gateway/transports/httptools_client.py",
    "tokenplane/gateway/transports/httptools_connection.py",
    "tokenplane/gateway/upstream.py",
    "tokenplane/gateway/upstreams.py",
    "tokenplane/gateway/view_signals.py",
    "tokenplane/gateway/workflows.py",
    "tokenplane/gateway/hint_fields.py",
    "tokenplane/ledger/aio.py",
    "tokenplane/ledger/rules.py",
    "tokenplane/ledger/store.py",
]


# The commands that build code; pip's metadata steps (egg_info, dist_info) need no C.
BUILDING = {"bdist_wheel", "build", "build_ext", "install"}


def _ext_modules() -> list[object]:
    if os.environ.get("TOKENPLANE_COMPILE", "") not in ("1", "true", "yes"):
        return []
    if "editable_wheel" in sys.argv[1:]:
        raise SystemExit(
            "TOKENPLANE_COMPILE=1 builds a regular install, not an editable one (the compiled "
            "modules would shadow the sources you edit): run scripts/build-compiled.sh"
        )
    if not BUILDING.intersection(sys.argv[1:]):
        return []
    from mypyc.build import mypycify  # only the compiled build needs mypy (and its plugins' packages)

    # mypy reads pyproject.toml's [tool.mypy] here (the pydantic plugin; strict core); a path
    # under src/ is named from src/ down, as the package is.
    return mypycify([f"src/{m}" for m in COMPILED_MODULES], opt_level="3", debug_level="0")


setup(ext_modules=_ext_modules())
