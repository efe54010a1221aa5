"""Where the gateway's instances come from: the config's list (``static``, the default), the config
file re-read when it changes (``file``), or ready pods in Kubernetes (``kubernetes``). Every source
hands the whole wanted set to :class:`~tokenplane.gateway.discovery.base.PoolSync`, which applies
the difference through the pool's add / drain / remove path (the autoscaler's path too)."""

from tokenplane.gateway.discovery.base import PoolSync, Source, start_discovery

__all__ = ["PoolSync", "Source", "start_discovery"]
