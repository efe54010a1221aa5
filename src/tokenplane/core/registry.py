"""One registry for every configurable plugin of the core, typed by plugin family.

Plugins are declared as ``{kind, name, params}`` (for example ``{kind: router, name: round-robin}``)
and built once at start-up. Each kind is a :class:`Family` that ties the config's ``kind`` to the
protocol its plugins implement (``ROUTERS`` is a ``Family[Router]`` in
:mod:`tokenplane.core.routing.base`, ``AUTOSCALERS`` one in :mod:`tokenplane.core.autoscale.base`)::

    @register(ROUTERS, "round-robin")           # the factory must return a Router (mypy checks it)
    def _build(params, ctx) -> RoundRobinRouter: ...

    router = build(spec, ctx, ROUTERS)          # typed Router, checked at run time too

Every failure is an :class:`~tokenplane.core.errors.InvalidPolicyConfig` that names the plugin by
its path ``kind/name``: an unknown kind or name, params the factory rejects, a spec of another kind
than the family asked for, and (:class:`~tokenplane.core.errors.PluginFamilyMismatch`) a factory
that built something that does not implement the family's protocol. The run-time check is what
makes the typed result honest: a factory is a plain callable, registered from any module.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from tokenplane.core.errors import InvalidPolicyConfig, PluginFamilyMismatch

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PluginSpec:
    kind: str
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str:
        """``kind/name``: how errors and the registry name this plugin."""
        return f"{self.kind}/{self.name}"

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


class Family(Generic[T]):
    """One kind of plugin: its config ``kind`` and the protocol every plugin of it implements.

    ``protocol`` must be ``runtime_checkable`` (``isinstance`` is the run-time check); it is typed
    as a plain ``type`` because mypy accepts no protocol where ``type[T]`` is expected, so ``T`` is
    bound by annotating the family: ``ROUTERS: Family[Router] = Family("router", Router)``.
    """

    __slots__ = ("kind", "protocol")

    def __init__(self, kind: str, protocol: type) -> None:
        self.kind = kind
        self.protocol = protocol

    def __repr__(self) -> str:
        return f"Family({self.kind!r}, {self.protocol.__name__})"

    def check(self, spec: PluginSpec, built: object) -> T:
        """``built`` as a member of this family, or :class:`PluginFamilyMismatch` naming the spec."""
        if not isinstance(built, self.protocol):
            raise PluginFamilyMismatch(
                f"{spec.path}: its factory built {type(built).__name__}, which does not implement "
                f"{self.protocol.__name__} (what a {self.kind} must be)"
            )
        return cast(T, built)


Factory = Callable[[Mapping[str, Any], BuildContext], T]

_FACTORIES: dict[tuple[str, str], Factory[Any]] = {}


def register(family: Family[T], name: str) -> Callable[[Factory[T]], Factory[T]]:
    """Register a factory of ``family`` under ``name``; a second one under the same path is refused."""

    def deco(factory: Factory[T]) -> Factory[T]:
        key = (family.kind, name)
        if key in _FACTORIES:
            raise InvalidPolicyConfig(f"duplicate plugin {family.kind}/{name}")
        _FACTORIES[key] = factory
        return factory

    return deco


def names(kind: str | Family[Any]) -> list[str]:
    """The registered names of one kind, sorted."""
    _load_builtins()
    wanted = kind.kind if isinstance(kind, Family) else kind
    return sorted(n for k, n in _FACTORIES if k == wanted)


def build(spec: PluginSpec, ctx: BuildContext, family: Family[T]) -> T:
    """Build the plugin ``spec`` names, as a member of ``family`` (see the module docstring)."""
    if spec.kind != family.kind:
        raise InvalidPolicyConfig(f"{spec.path}: expected kind {family.kind!r}, got {spec.kind!r}")
    _load_builtins()
    factory = _FACTORIES.get((spec.kind, spec.name))
    if factory is None:
        raise InvalidPolicyConfig(
            f"unknown {spec.kind} {spec.name!r}; known: {', '.join(names(spec.kind)) or 'none'}"
        )
    try:
        built = factory(spec.params, ctx)
    except InvalidPolicyConfig:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise InvalidPolicyConfig(
            f"{spec.kind} {spec.name!r}: bad params {dict(spec.params)!r}: {exc}"
        ) from exc
    return family.check(spec, built)


def _load_builtins() -> None:
    # Importing the plugin modules registers them; done lazily to keep import order simple.
    import tokenplane.core.autoscale  # noqa: F401
    from tokenplane.core import routing  # noqa: F401
