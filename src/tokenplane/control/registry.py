"""The gateway's side of activation and draining: a :class:`PoolRegistry`.

The loop owns the instance lifecycle; the gateway owns routing. Three calls connect them:

* ``add(url, instance_id)``: start routing to a new instance (ACTIVATE_WARM);
* ``drain(instance_id)``: stop routing *new* requests to it; requests in flight finish normally,
  and the instance stays visible to the signal source (with its ``outstanding_requests``) so the
  loop can tell when it is empty;
* ``remove(instance_id)``: forget it (called once it is empty, or after ``max_drain_s``).

:class:`InMemoryPoolRegistry` is the fake for tests (and a reference for the gateway's adapter);
:class:`DryRunRegistry` logs and does nothing.
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

from tokenplane.control.actuators import kv
from tokenplane.core.views import InstanceView

log = logging.getLogger(__name__)


@runtime_checkable
class PoolRegistry(Protocol):
    async def add(self, url: str, instance_id: str) -> None: ...

    async def drain(self, instance_id: str) -> None: ...

    async def remove(self, instance_id: str) -> None: ...


class InMemoryPoolRegistry:
    """A pool in a dict: what is routable, what is draining, and what is in flight where (tests)."""

    def __init__(self, model: str = "") -> None:
        self.model = model
        self.urls: dict[str, str] = {}
        self.draining: set[str] = set()
        self.in_flight: dict[str, int] = {}
        self.ops: list[tuple[str, str]] = []

    async def add(self, url: str, instance_id: str) -> None:
        self.ops.append(("add", instance_id))
        self.urls[instance_id] = url
        self.draining.discard(instance_id)

    async def drain(self, instance_id: str) -> None:
        self.ops.append(("drain", instance_id))
        if instance_id in self.urls:
            self.draining.add(instance_id)

    async def remove(self, instance_id: str) -> None:
        self.ops.append(("remove", instance_id))
        self.urls.pop(instance_id, None)
        self.draining.discard(instance_id)
        self.in_flight.pop(instance_id, None)

    def routable(self) -> list[str]:
        return [i for i in self.urls if i not in self.draining]

    def views(self) -> tuple[InstanceView, ...]:
        """Every registered instance (draining ones too), as the gateway's views would show it."""
        return tuple(
            InstanceView(instance_id=i, model=self.model, outstanding_requests=self.in_flight.get(i, 0))
            for i in self.urls
        )


class DryRunRegistry:
    """Logs what it would ask of the gateway's pool and does nothing."""

    def __init__(self, inner: PoolRegistry | None = None) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []

    async def _would(self, op: str, instance_id: str, url: str | None = None) -> None:
        self.calls.append((op, instance_id))
        log.info("autoscaler dry_run %s", kv(target="pool", op=op, id=instance_id, url=url or "-"))

    async def add(self, url: str, instance_id: str) -> None:
        await self._would("add", instance_id, url)

    async def drain(self, instance_id: str) -> None:
        await self._would("drain", instance_id)

    async def remove(self, instance_id: str) -> None:
        await self._would("remove", instance_id)
