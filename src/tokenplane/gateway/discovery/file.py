"""``discovery: {kind: file, path: ...}``: the ``instances`` list of a gateway config file, re-read
when the file changes (checked every ``interval_s``; a ConfigMap update replaces the file). A file
that does not validate is logged and ignored: the instances in use stay."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from tokenplane.gateway.config import ConfigError, load_config
from tokenplane.gateway.discovery.base import PoolSync

log = logging.getLogger("tokenplane.gateway.discovery")


class FileSource:
    def __init__(self, path: str, interval_s: float) -> None:
        self.path = Path(path)
        self.interval_s = interval_s

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    async def run(self, sync: PoolSync) -> None:
        seen = self._stamp()
        while True:
            await asyncio.sleep(self.interval_s)
            stamp = self._stamp()
            if stamp is None or stamp == seen:
                continue
            seen = stamp
            try:
                cfg = load_config(self.path)
            except ConfigError as exc:
                log.error("discovery: %s is invalid, keeping the instances in use: %s", self.path, exc)
                continue
            sync.apply({i.id: i for i in cfg.instances})


__all__ = ["FileSource"]
