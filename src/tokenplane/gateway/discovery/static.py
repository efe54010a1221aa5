"""``discovery: {kind: static}`` (the default): the config's ``instances`` list, fixed for the
process's life; the pool is built from it at start and nothing runs."""

from __future__ import annotations

from tokenplane.gateway.config import InstanceConfig
from tokenplane.gateway.discovery.base import PoolSync


class StaticSource:
    def __init__(self, instances: tuple[InstanceConfig, ...]) -> None:
        self.instances = {i.id: i for i in instances}

    async def run(self, sync: PoolSync) -> None:
        sync.apply(self.instances)


__all__ = ["StaticSource"]
