"""``POST /v1/keys/revoke``: a tenant revokes one of its API keys while the gateway runs.

The gateway has no configuration reload, so revocation is a route: authenticated with a key of the
tenant (any of them, the revoked one included: a leaked key can be revoked with itself), naming the
key to revoke in its stored form, ``{"key_hash": "sha256:<hex>"}`` (so the raw key need not travel
again). A key of another tenant, or one already revoked, is a 404 that says no more. Revocation is
in memory and per gateway process: take the key out of the config too, or it is back at the next
start.
"""

from __future__ import annotations

import re

import msgspec
from aiohttp import web

from tokenplane.gateway.edges.aiohttp_edge import AiohttpClient
from tokenplane.gateway.errors import (
    GatewayError,
    InvalidParameter,
    MalformedJSON,
    RouteNotFound,
    error_response,
)
from tokenplane.gateway.tenants import Authenticator

REVOKE_PATH = "/v1/keys/revoke"
_KEY_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")
_MAX_BODY_BYTES = 1024


class Keys:
    """The revocation route over one gateway's authenticator."""

    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    async def revoke(self, request: web.Request) -> web.Response:
        try:
            tenant = self.auth.authenticate(request.headers.get("Authorization"))
            client = AiohttpClient(request)
            raw = client.body_now(_MAX_BODY_BYTES)
            if raw is None:
                raw = await client.read_body(_MAX_BODY_BYTES)
            try:
                body = msgspec.json.decode(raw)
            except msgspec.DecodeError:
                raise MalformedJSON("the request body is not valid JSON") from None
            key_hash = body.get("key_hash") if isinstance(body, dict) else None
            if not isinstance(key_hash, str) or not _KEY_HASH.match(key_hash):
                raise InvalidParameter(
                    "'key_hash' must be 'sha256:' + 64 lowercase hex digits", param="key_hash"
                )
            if not self.auth.revoke(tenant, key_hash):
                raise RouteNotFound("no such key for this tenant", param="key_hash", code="key_not_found")
        except GatewayError as exc:
            return error_response(exc)
        body_out = msgspec.json.encode({"revoked": key_hash, "tenant": tenant.name})
        return web.Response(body=body_out, content_type="application/json")


__all__ = ["REVOKE_PATH", "Keys"]
