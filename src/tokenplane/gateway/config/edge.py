"""The HTTP side of the gateway: where it listens, the edge's limits and timeouts, request limits,
draining on SIGTERM and reloading the file."""

from __future__ import annotations

from pydantic import Field

from tokenplane.gateway.config.base import Strict

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_MAX_TOKENS = 32_768
DEFAULT_MAX_PROMPT_TOKENS = 131_072
DEFAULT_UPSTREAM_TIMEOUT_S = 300.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_KEEPALIVE_TIMEOUT_S = 75.0
DEFAULT_MAX_REQUEST_LINE_BYTES = 8190
DEFAULT_MAX_FIELD_BYTES = 8190
DEFAULT_MAX_HEADERS = 100


class ListenConfig(Strict):
    host: str = DEFAULT_HOST
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    # The completion routes' own HTTP/1.1 front (gateway/fast_front.py); false: aiohttp serves all.
    fast_front: bool = True


class EdgeConfig(Strict):
    """The HTTP edge's own limits and timeouts (both edges; see :mod:`tokenplane.gateway.edges`)."""

    header_timeout_s: float = Field(DEFAULT_HEADER_TIMEOUT_S, gt=0)
    """From a request's first byte to the end of its head; later: 408 and the connection closed."""
    body_timeout_s: float = Field(DEFAULT_BODY_TIMEOUT_S, gt=0)
    """From the end of a request's head to the end of its body; later: 408 and closed."""
    keepalive_timeout_s: float = Field(DEFAULT_KEEPALIVE_TIMEOUT_S, gt=0)
    """An idle keep-alive connection is closed after this long."""
    max_request_line_bytes: int = Field(DEFAULT_MAX_REQUEST_LINE_BYTES, ge=64)
    """A longer request line is refused with 414."""
    max_field_bytes: int = Field(DEFAULT_MAX_FIELD_BYTES, ge=64)
    """A longer header line (name and value) is refused with 431."""
    max_headers: int = Field(DEFAULT_MAX_HEADERS, ge=1)
    """More header lines are refused with 431."""


class LimitsConfig(Strict):
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1)
    max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1)
    max_prompt_tokens: int = Field(DEFAULT_MAX_PROMPT_TOKENS, ge=1)
    upstream_timeout_s: float = Field(DEFAULT_UPSTREAM_TIMEOUT_S, gt=0)
    connect_timeout_s: float = Field(DEFAULT_CONNECT_TIMEOUT_S, gt=0)
    """Bounds the TCP handshake with an instance on the request path. A handshake the kernel
    finished while the gateway's loop was stalled counts as made (transports/tcp_connect.py)."""


class DrainConfig(Strict):
    """SIGTERM: requests in flight get up to ``deadline_s`` to finish (keep it under the pod's
    ``terminationGracePeriodSeconds``, 120 s in deploy/kubernetes) before the gateway exits."""

    deadline_s: float = Field(110.0, gt=0)


class ReloadConfig(Strict):
    """Reload tenants, models and limits when the config file changes (SIGHUP reloads always)."""

    watch: bool = True
    interval_s: float = Field(1.0, gt=0)
