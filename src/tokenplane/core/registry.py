"""One registry for every configurable plugin of the core.

Plugins are declared as ``{kind, name, params}`` (for example ``{kind: router, name: round-robin}``)
and built once at start-up; an unknown kind or name, or params the factory rejects, fail there with a
:class:`~tokenplane.core.errors.InvalidPolicyConfig` that names the plugin.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenplane.core.errors import InvalidPolicyConfig


@dataclass(frozen=True, slots=True)
class PluginSpec:
    kind: str
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | str, *, default_kind: str) -> PluginSpec:
        """Accept ``"name"`` or ``{kind?, name, params?}``."""
        if isinstance(raw, str):
            return cls(default_kind, raw, {})
        if not isinstance(raw, Mapping) or "name" not in raw:
            raise InvalidPolicyConfig(f"plugin config must be a name or a mapping with 'name', got {raw!r}")
        extra = set(raw) - {"kind", "name", "params"}
        if extra:
            raise InvalidPolicyConfig(f"plugin {raw.get('name')!r}: unknown keys {sorted(extra)}")
        params = raw.get("params") or {}
        if not isinstance(params, Mapping):
            raise InvalidPolicyConfig(f"plugin {raw['name']!r}: params must be a mapping")
        return cls(str(raw.get("kind", default_kind)), str(raw["name"]), dict(params))


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What factories may receive besides their params: a seeded RNG (never the global one)."""

    rng: random.Random


Factory = Callable[[Mapping[str, Any], BuildContext], Any]

_FACTORIES: dict[tuple[str, str], Factory] = {}


def register(kind: str, name: str) -> Callable[[Factory], Factory]:
    def deco(factory: Factory) -> Factory:
        key = (kind, name)
        if key in _FACTORIES:
            raise InvalidPolicyConfig(f"duplicate plugin {kind}/{name}")
        _FACTORIES[key] = factory
        return factory

    return deco


def names(kind: str) -> list[str]:
    _load_builtins()
    return sorted(n for k, n in _FACTORIES if k == kind)


def build(spec: PluginSpec, ctx: BuildContext) -> Any:
    _load_builtins()
    factory = _FACTORIES.get((spec.kind, spec.name))
    if factory is None:
        raise InvalidPolicyConfig(
            f"unknown {spec.kind} {spec.name!r}; known: {', '.join(names(spec.kind)) or 'none'}"
        )
    try:
        return factory(spec.params, ctx)
    except InvalidPolicyConfig:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise InvalidPolicyConfig(
            f"{spec.kind} {spec.name!r}: bad params {dict(spec.params)!r}: {exc}"
        ) from exc


def _load_builtins() -> None:
    # Importing the plugin modules registers them; done lazily to keep import order simple.
    import tokenplane.core.autoscale  # noqa: F401
    from tokenplane.core import routing  # noqa: F401
