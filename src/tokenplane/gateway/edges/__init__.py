"""Edges: where a client's request comes in and its answer goes out.

Two implementations of one :class:`~tokenplane.gateway.edges.base.ClientStream` protocol:
:mod:`~tokenplane.gateway.edges.aiohttp_edge` (aiohttp's server: every route, and the completion
routes when the fast front is off or hands a connection over) and
:mod:`~tokenplane.gateway.edges.fast_front` (the completion routes' own HTTP/1.1 front). Nothing
above the edge knows which one a request came through; only the edge writes to the client.
"""
