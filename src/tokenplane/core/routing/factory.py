"""Build a router from its config slice: ``"round-robin"``, ``{name, params}`` or ``{kind, name, params}``.

The single entry point shells use; validation happens here, once, at start-up, and every failure is
an :class:`~tokenplane.core.errors.InvalidPolicyConfig` naming the plugin and the reason.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.registry import BuildContext, PluginSpec, build
from tokenplane.core.routing.base import ROUTERS, Router


def build_router(raw_config: Mapping[str, Any] | str, rng: random.Random) -> Router:
    """Parse and build one router; ``rng`` is the only randomness it will ever use."""
    if not isinstance(rng, random.Random):
        raise InvalidPolicyConfig(f"build_router needs a random.Random, got {type(rng).__name__}")
    spec = PluginSpec.parse(raw_config, default_kind="router")
    return build(spec, BuildContext(rng), ROUTERS)
