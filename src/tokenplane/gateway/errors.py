"""Errors the gateway answers with, and the one place that turns them into OpenAI-style responses.

Hierarchy::

    GatewayError                      every refusal or failure a caller can see
    ├── InvalidRequest                400 invalid_request_error
    │   ├── MalformedJSON             400 the body is not a JSON object
    │   ├── InvalidParameter          400 a field is missing or has the wrong type or range
    │   │   └── InvalidHint           400 a workflow hint (header or body field) is malformed
    │   └── ContextLengthExceeded     400 max_tokens or the prompt is over the limit
    ├── BodyTooLarge                  413 the body is over limits.max_body_bytes
    ├── BadHttp                       400 the edge refused the message's framing or syntax
    │   ├── RequestTimeout            408 the head or body did not arrive within edge timeouts
    │   ├── ExpectationFailed         417 an Expect other than 100-continue
    │   ├── RequestLineTooLong        414 the request line is over edge.max_request_line_bytes
    │   ├── HeadersTooLarge           431 a header line over edge.max_field_bytes, or too many
    │   └── UnsupportedCoding         501 a transfer coding other than chunked
    ├── AuthenticationFailed          401 missing or unknown API key
    ├── ModelNotFound                 404 no such model (or not one this tenant may use)
    ├── WorkflowNotFound              404 no such workflow (the admin API)
    ├── RouteNotFound                 404 unknown path
    │   └── MethodNotAllowed          405 known path, other method
    ├── Refused                       429 / 503, with Retry-After
    │   ├── TenantConcurrencyExceeded 429 the tenant has max_concurrency requests in flight
    │   ├── TenantRateLimited         429 a requests- or tokens-per-minute limit is spent
    │   ├── TenantOverShare           429 admission: the tenant's queue or in-flight share is full
    │   ├── KvWorkingSetFull          429 a new task while the tasks in progress fill the KV cache
    │   ├── PoolSaturated             503 admission: queue full, shed, or expired while queued
    │   ├── NoHealthyInstance         503 no ready and healthy instance (or every breaker open)
    │   ├── LedgerUnreachable         503 the workflow ledger's store cannot be reached
    │   └── Draining                  503 the gateway is shutting down (SIGTERM); retry elsewhere
    ├── KvTransferFailed              502 a decode instance could not load its prefill's KV (P/D)
    └── UpstreamError                 502 / 504, the instance failed us
        ├── UpstreamUnavailable       502 connection refused or reset, or a 5xx answer
        ├── UpstreamProtocolError     502 the answer is not what the API promises
        │   └── KvHandoverInvalid     502 a prefill instance answered without usable kv_transfer_params
        └── UpstreamTimeout           504 no answer within limits.upstream_timeout_s
            ├── UpstreamStalled       504 a stream went silent mid-way
            └── DeadlineExceeded      504 the request's own latency budget ran out

Two more are never answered as such:

    ConfigError (a ValueError)        the configuration file is missing, unreadable or invalid,
                                      raised at start-up; the message names the field
    UpstreamConnectionError           the hot-path client's transport failure (a ConnectionError);
                                      the attempt turns it into UpstreamUnavailable

``ConfigError`` is re-exported by ``gateway.config`` and ``tokenplane.gateway``, the others by the
modules that first defined them (``gateway.workflows``,
``gateway.transports.httptools_connection``).

Every error renders as ``{"error": {"message", "type", "code", "param"}}`` through
:func:`error_response` (a whole response) or :func:`error_event` (an SSE event that ends a stream
already under way). Nothing else in the package builds an error body.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import ClassVar

import msgspec
from aiohttp import web
from mypy_extensions import mypyc_attr


@mypyc_attr(native_class=False)  # like every exception class here that derives from a builtin
class ConfigError(ValueError):
    """The configuration file is missing, unreadable or invalid; the message names the field."""


@mypyc_attr(native_class=False)  # other than Exception (see CONTRIBUTING.md, "The compiled build")
class UpstreamConnectionError(ConnectionError):
    """The instance refused, reset or closed the connection, or sent something that is not HTTP."""


class GatewayError(Exception):
    status: ClassVar[int] = 500
    type: ClassVar[str] = "internal_error"
    default_code: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after_s: float | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code
        self.param = param
        self.retry_after_s = retry_after_s
        self.detail = detail

    @property
    def reason(self) -> str:
        """The message with its ``detail``, for operators (logs, ``GET /v1/instances``): the detail
        may name an instance's address, which the client's message does not."""
        return self.message if self.detail is None else f"{self.message} ({self.detail})"

    @property
    def outcome(self) -> str:
        """A short label for metrics (the class name in snake case would be long and unstable)."""
        return self.code or self.type


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    default_code = "invalid_request"


class MalformedJSON(InvalidRequest):
    default_code = "invalid_json"


class InvalidParameter(InvalidRequest):
    default_code = "invalid_type"


class ContextLengthExceeded(InvalidRequest):
    default_code = "context_length_exceeded"


class InvalidHint(InvalidParameter):
    default_code = "invalid_workflow_hint"


class BodyTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    default_code = "request_too_large"


class BadHttp(GatewayError):
    """The edge refused the message itself (RFC 9112); the connection is closed after the answer."""

    status = 400
    type = "invalid_request_error"
    default_code = "bad_http_request"


class RequestTimeout(BadHttp):
    status = 408
    default_code = "request_timeout"


class ExpectationFailed(BadHttp):
    status = 417
    default_code = "expectation_failed"


class RequestLineTooLong(BadHttp):
    status = 414
    default_code = "request_line_too_long"


class HeadersTooLarge(BadHttp):
    status = 431
    default_code = "headers_too_large"


class UnsupportedCoding(BadHttp):
    status = 501
    default_code = "unsupported_transfer_coding"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "authentication_error"
    default_code = "invalid_api_key"


class ModelNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    default_code = "model_not_found"


class WorkflowNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    default_code = "workflow_not_found"


class RouteNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    default_code = "not_found"


class MethodNotAllowed(RouteNotFound):
    status = 405
    default_code = "method_not_allowed"


class Refused(GatewayError):
    status = 503
    type = "service_unavailable"
    default_code = "refused"


class LedgerUnreachable(Refused):
    default_code = "ledger_unavailable"


class TenantConcurrencyExceeded(Refused):
    status = 429
    type = "rate_limit_error"
    default_code = "concurrency_limit_exceeded"


class TenantRateLimited(Refused):
    """A tenant's or an API key's requests- or tokens-per-minute limit is spent."""

    status = 429
    type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class TenantOverShare(Refused):
    status = 429
    type = "rate_limit_error"
    default_code = "tenant_over_share"


class KvWorkingSetFull(Refused):
    status = 429
    type = "rate_limit_error"
    default_code = "kv_working_set"


class PoolSaturated(Refused):
    default_code = "pool_saturated"


class NoHealthyInstance(Refused):
    default_code = "no_healthy_instance"


class Draining(Refused):
    default_code = "draining"


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"
    default_code = "upstream_error"


class UpstreamUnavailable(UpstreamError):
    default_code = "upstream_unavailable"

    @classmethod
    def caused_by(cls, what: str, exc: BaseException) -> UpstreamUnavailable:
        """``what`` and the error's class for the client; the error's own words as the detail."""
        return cls(f"{what}: {type(exc).__name__}", detail=str(exc) or None)


class UpstreamProtocolError(UpstreamError):
    default_code = "upstream_protocol_error"


class KvHandoverInvalid(UpstreamProtocolError):
    """A prefill instance of a disaggregated pool answered without usable ``kv_transfer_params``."""

    default_code = "kv_handover_invalid"


class KvTransferFailed(GatewayError):
    """A decode instance could not load the KV its prefill handed over (the prefill engine is gone,
    or no longer holds it): the prefill's fault, not the decode instance's (which answered, so it is
    not an :class:`UpstreamError` of its own); the flow prefills again."""

    status = 502
    type = "upstream_error"
    default_code = "kv_transfer_failed"


class UpstreamTimeout(UpstreamError):
    status = 504
    default_code = "upstream_timeout"


class UpstreamStalled(UpstreamTimeout):
    """A stream that went silent mid-way. ``busy``: the instance kept answering other requests
    meanwhile, so the stream moves on but the instance is not taken out for it."""

    def __init__(self, message: str, *, busy: bool) -> None:
        super().__init__(message)
        self.busy = busy


class DeadlineExceeded(UpstreamTimeout):
    """The request's own latency budget ran out before the instance answered: a miss, not a fault."""

    default_code = "deadline_exceeded"


class _ErrorBody(msgspec.Struct):
    message: str
    type: str
    code: str | None
    param: str | None


class _Envelope(msgspec.Struct):
    error: _ErrorBody


_encode = msgspec.json.Encoder().encode


def error_body(exc: GatewayError) -> bytes:
    return _encode(_Envelope(_ErrorBody(exc.message, exc.type, exc.code, exc.param)))


def error_message(exc: GatewayError, *, close: bool = True) -> bytes:
    """A whole HTTP/1.1 error answer as bytes, for an edge writing to its transport itself (no
    request object to answer through: a head that never completed, a body that stopped)."""
    body = error_body(exc)
    reason = _REASONS.get(exc.status, "Error")
    connection = b"Connection: close\r\n" if close else b""
    return b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s" % (
        exc.status,
        reason.encode("ascii"),
        connection,
        len(body),
        body,
    )


_REASONS = {s.value: s.phrase for s in HTTPStatus}


def error_response(exc: GatewayError) -> web.Response:
    headers = None
    if exc.retry_after_s is not None:
        headers = {"Retry-After": str(max(1, round(exc.retry_after_s)))}
    return web.Response(
        status=exc.status, body=error_body(exc), content_type="application/json", headers=headers
    )


def error_event(exc: GatewayError) -> bytes:
    """An SSE error event followed by ``[DONE]``: ends a stream in a shape OpenAI clients understand."""
    return b"data: " + error_body(exc) + b"\n\ndata: [DONE]\n\n"
