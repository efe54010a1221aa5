"""The live gateway: an OpenAI-compatible streaming data plane in front of real runtimes.

``create_app(load_config(path))`` gives an aiohttp application;
:class:`~tokenplane.gateway.server.GatewayServer` listens for it (the completion routes through
:mod:`~tokenplane.gateway.edges.fast_front`), and ``serve`` runs that until interrupted. See
:mod:`tokenplane.gateway.app` for the request pipeline.
"""

from tokenplane.gateway.app import Gateway, create_app
from tokenplane.gateway.config import ConfigError, GatewayConfig, hash_key, load_config, parse_config

__all__ = ["ConfigError", "Gateway", "GatewayConfig", "create_app", "hash_key", "load_config", "parse_config"]
