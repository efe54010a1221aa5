"""The per-request context: one object from a request's arrival to its last byte.

Each stage owns its part (the comments below name the owner) and reads what earlier stages wrote;
the respond stage reads the accounting part for metrics, the ledger and the trace. Fields that a
stage has not reached yet hold their empty value (``None``, ``"unknown"``, 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from tokenplane.gateway.tracing import NULL_TRACE, Trace

if TYPE_CHECKING:
    from tokenplane.core.views import RequestInfo
    from tokenplane.core.workflow_hints import WorkflowHints
    from tokenplane.gateway.catalog import ServedModel
    from tokenplane.gateway.edges.base import ClientStream
    from tokenplane.gateway.request import ParsedRequest
    from tokenplane.gateway.response_cache import CacheKey
    from tokenplane.gateway.tenants import Tenant
    from tokenplane.gateway.upstreams import Upstream
    from tokenplane.gateway.workflows import AttemptLog

OUTCOME_OK = "ok"


class RequestContext:
    """Mutable per-request state shared by the stages (see the module docstring)."""

    __slots__ = (
        "admitted",
        "answer_body",
        "answered",
        "arrival",
        "cache_key",
        "cacheable",
        "caller",
        "client",
        "completion_tokens",
        "deadline_s",
        "deferred",
        "endpoint",
        "events_sent",
        "hints",
        "info",
        "ledger",
        "model",
        "outcome",
        "parsed",
        "reason",
        "response",
        "served",
        "stream",
        "tenant",
        "trace",
        "ttft_s",
        "upstream",
    )

    def __init__(self, client: ClientStream, endpoint: str, arrival: float) -> None:
        # the edge
        self.client = client
        self.endpoint = endpoint  # "chat", "completions", or a passed-through path ("/v1/embeddings")
        self.arrival = arrival
        self.response: web.StreamResponse | None = None  # an answer to return (the edge sends it)
        # respond: accounting labels and the request's outcome
        self.model = "unknown"
        self.tenant = "unknown"
        self.reason = "none"
        self.outcome = OUTCOME_OK
        self.stream = False
        self.trace: Trace = NULL_TRACE
        # authenticate
        self.caller: Tenant | None = None
        # parse (and fallback, which may move the request to another model)
        self.parsed: ParsedRequest | None = None
        self.served: ServedModel | None = None
        # response cache
        self.cache_key: CacheKey | None = None
        self.cacheable = False  # a successful answer goes into the response cache (header "miss")
        self.answer_body: bytes | None = None  # the JSON answer sent, kept for the cache
        # tenant limits
        self.hints: WorkflowHints | None = None
        self.info: RequestInfo | None = None
        self.ledger: AttemptLog | None = None  # set when the workflow ledger is on
        # deferral, admission
        self.deferred = False
        self.admitted = False  # holds a slot of the model's pool until admission's exit
        self.deadline_s = 0.0
        # forward
        self.upstream: Upstream | None = None
        self.ttft_s: float | None = None
        self.events_sent = 0
        self.completion_tokens = 0
        # the stream's last event (``data: [DONE]``) was written to the client's connection: a
        # client that leaves after that got the whole answer (an ``ok``, not a disconnect)
        self.answered = False


__all__ = ["OUTCOME_OK", "RequestContext"]
