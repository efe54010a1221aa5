"""Transports: how a request reaches an instance and its answer comes back.

One :class:`~tokenplane.gateway.transports.base.UpstreamTransport` protocol, two implementations:
:mod:`~tokenplane.gateway.transports.httptools_client` (the hot-path HTTP/1.1 client, for plain
``http://`` instances) and :mod:`~tokenplane.gateway.transports.aiohttp_transport` (aiohttp's
client: ``https://`` instances, and whatever the hot path does not serve). Both answer with an
:class:`~tokenplane.gateway.transports.base.UpstreamReply`; nothing above them knows which one did.
"""
