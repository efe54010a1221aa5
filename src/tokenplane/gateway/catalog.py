"""Served models: names and aliases, each model's router, and the ``/v1/models`` listing.

A model name or alias resolves to one :class:`ServedModel`; each has its own router instance (built
once from its config slice through the core's registry), so prefix indexes and cursors never mix
models. A tenant restricted to some models sees the others as absent (404, not 403: no probing).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import msgspec

from tokenplane.core.routing import Router, build_router
from tokenplane.gateway.config import ModelConfig
from tokenplane.gateway.errors import ModelNotFound
from tokenplane.gateway.tenants import Tenant

OWNED_BY = "tokenplane"


class ServedModel:
    __slots__ = ("adapters", "aliases", "name", "router", "served_name")

    def __init__(self, config: ModelConfig, rng: random.Random) -> None:
        self.name = config.name
        self.aliases = config.aliases
        self.adapters = frozenset(config.adapters)  # LoRA adapters served on this model
        self.served_name = config.served_name
        self.router: Router = build_router(config.router, rng)


class _ModelEntry(msgspec.Struct):
    id: str
    object: str = "model"
    created: int = 0
    owned_by: str = OWNED_BY


class _ModelList(msgspec.Struct):
    data: list[_ModelEntry]
    object: str = "list"


class ModelCatalog:
    def __init__(self, models: Sequence[ModelConfig], rng: random.Random) -> None:
        self.models = [ServedModel(m, rng) for m in models]
        self._by_name: dict[str, ServedModel] = {}
        for m in self.models:
            for n in (m.name, *m.aliases, *m.adapters):
                self._by_name[n] = m
        self._listings: dict[str, bytes] = {}

    def resolve(self, name: str, tenant: Tenant) -> ServedModel:
        model = self._by_name.get(name)
        if model is None or not (tenant.may_use(name) or tenant.may_use(model.name)):
            raise ModelNotFound(
                f"the model {name!r} does not exist or you do not have access to it", param="model"
            )
        return model

    def listing(self, tenant: Tenant) -> bytes:
        """The ``/v1/models`` body for a tenant (cached: it changes only with the config)."""
        body = self._listings.get(tenant.name)
        if body is None:
            names = [n for n in self._by_name if tenant.may_use(n) or tenant.may_use(self._by_name[n].name)]
            body = msgspec.json.encode(_ModelList([_ModelEntry(n) for n in names]))
            self._listings[tenant.name] = body
        return body
