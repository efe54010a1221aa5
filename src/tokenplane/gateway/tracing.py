"""OpenTelemetry spans for each request, exported over OTLP/HTTP when ``tracing.otlp_endpoint`` is set.

One trace per completion request (a child of the client's ``traceparent`` when it sent one, W3C
trace context); spans, all children of the request's span:

* ``POST /v1/chat/completions`` (kind SERVER): the whole request; ``tokenplane.tenant``,
  ``tokenplane.model``, ``tokenplane.outcome``, ``tokenplane.stream``, ``http.response.status_code``,
  the workflow's id and step when it has one, ``tokenplane.tokens.prompt`` / ``.output``.
* ``tokenplane.authenticate``: API key to tenant.
* ``tokenplane.admission``: the admission decision, ``tokenplane.queue_wait_s`` (0 when admitted at
  once) and ``tokenplane.priority``.
* ``tokenplane.route``: one per routing decision (a retry routes again): ``tokenplane.instance`` and
  ``tokenplane.route.reason``.
* ``tokenplane.upstream`` (kind CLIENT) per upstream attempt, or ``tokenplane.continuation`` for an
  attempt that continues a broken stream: ``tokenplane.instance``, ``tokenplane.attempt.number``,
  ``tokenplane.attempt.kind`` (first, retry, continuation), ``tokenplane.attempt.result``,
  ``tokenplane.tokens.prompt`` / ``.output``, ``tokenplane.cost_usd``; error status when it failed.
  Its context goes to the instance as ``traceparent`` (vLLM continues the trace when it traces).

The gateway keeps its own :class:`TracerProvider` (never the process-global one), sampled
``ParentBased(TraceIdRatioBased(sample_ratio))``. With tracing off, ``Gateway.tracing`` is ``None``
and each request's trace is :data:`NULL_TRACE`, which has the same methods and does nothing: any
code may call a request's trace without a test. The per-request sites of the stages (authenticate,
describe, admission, route, attempt, finish) still skip the calls with one ``trace is NULL_TRACE``
test each: eleven calls that do nothing are a measurable share of a JSON request's instructions
(``bench/gateway_inproc.py --instructions``). Spans left open by an exception are
ended, with error status, when the request ends.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tokenplane.core.admission import PriorityClass
from tokenplane.core.retry_budget import AttemptKind

if TYPE_CHECKING:
    from tokenplane.core.views import RequestInfo

from tokenplane.gateway.config import TracingConfig

__all__ = ["RequestTrace", "Tracing", "otlp_traces_url"]

_PROPAGATOR = TraceContextTextMapPropagator()


def otlp_traces_url(endpoint: str) -> str:
    """The collector's base URL gets ``/v1/traces``; a URL with a path is used as it is."""
    path = urlsplit(endpoint).path
    return endpoint if path not in ("", "/") else endpoint.rstrip("/") + "/v1/traces"


class Tracing:
    """The gateway's tracer; :meth:`begin` one :class:`RequestTrace` per request."""

    def __init__(self, config: TracingConfig, *, exporter: SpanExporter | None = None) -> None:
        self.config = config
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name}),
            sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
        )
        if exporter is not None:
            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        if config.otlp_endpoint:
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise RuntimeError(
                    "tracing.otlp_endpoint needs the OTLP exporter: pip install 'tokenplane[otel]'"
                ) from exc

            otlp = OTLPSpanExporter(endpoint=otlp_traces_url(config.otlp_endpoint))
            self.provider.add_span_processor(BatchSpanProcessor(otlp))
        self.tracer = self.provider.get_tracer("tokenplane.gateway")

    @classmethod
    def from_config(cls, config: TracingConfig) -> Tracing | None:
        return cls(config) if config.otlp_endpoint else None

    def begin(self, headers: Mapping[str, str], method: str, path: str) -> Trace:
        parent = _PROPAGATOR.extract(headers)
        root = self.tracer.start_span(
            f"{method} {path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path},
        )
        return RequestTrace(self, root)

    def shutdown(self) -> None:
        """Flush and stop (blocking: the OTLP exporter may send; run it off the event loop)."""
        self.provider.shutdown()


class Trace(Protocol):
    """One request's spans: :class:`RequestTrace`, or :data:`NULL_TRACE` with tracing off.

    The request path calls the named methods below with positional arguments (and computes no
    attribute for them), so that with tracing off each costs one call to a method that does nothing.
    """

    def start(self, name: str, *, client: bool = False, **attributes: Any) -> Any: ...

    def end(self, span: Any, error: str | None = None, **attributes: Any) -> None: ...

    def headers(self, span: Any) -> dict[str, str] | None: ...

    def set(self, **attributes: Any) -> None: ...

    def finish(self, outcome: str) -> None: ...

    def begin_step(self, name: str) -> Any:
        """A child span with no attributes yet (authenticate, route)."""
        ...

    def authenticated(self, span: Any, tenant: str) -> None: ...

    def described(self, tenant: str, model: str, stream: bool, info: RequestInfo) -> None:
        """The request's own attributes on its root span, once it is described."""
        ...

    def begin_admission(self, priority: PriorityClass) -> Any: ...

    def admitted(self, span: Any, started_s: float) -> None: ...

    def routed(self, span: Any, instance: str, reason: str) -> None: ...

    def begin_attempt(self, instance: str, number: int, kind: AttemptKind, tokens_in: int) -> Any: ...

    def end_attempt(
        self, span: Any, error: str | None, result: str, tokens_out: int, cost_usd: float
    ) -> None: ...

    def refused(self, status: int) -> None: ...


class NullTrace:
    """The trace of a request when tracing is off: every method does nothing."""

    __slots__ = ()

    def start(self, name: str, *, client: bool = False, **attributes: Any) -> Any:
        return None

    def end(self, span: Any, error: str | None = None, **attributes: Any) -> None:
        pass

    def headers(self, span: Any) -> dict[str, str] | None:
        return None

    def set(self, **attributes: Any) -> None:
        pass

    def finish(self, outcome: str) -> None:
        pass

    def begin_step(self, name: str) -> Any:
        return None

    def authenticated(self, span: Any, tenant: str) -> None:
        pass

    def described(self, tenant: str, model: str, stream: bool, info: RequestInfo) -> None:
        pass

    def begin_admission(self, priority: PriorityClass) -> Any:
        return None

    def admitted(self, span: Any, started_s: float) -> None:
        pass

    def routed(self, span: Any, instance: str, reason: str) -> None:
        pass

    def begin_attempt(self, instance: str, number: int, kind: AttemptKind, tokens_in: int) -> Any:
        return None

    def end_attempt(
        self, span: Any, error: str | None, result: str, tokens_out: int, cost_usd: float
    ) -> None:
        pass

    def refused(self, status: int) -> None:
        pass


NULL_TRACE = NullTrace()


class RequestTrace:
    """One request's spans; every child hangs off the request's span."""

    __slots__ = ("_ctx", "_open", "_tracer", "root")

    def __init__(self, tracing: Tracing, root: Span) -> None:
        self._tracer = tracing.tracer
        self.root = root
        self._ctx: Context = set_span_in_context(root)
        self._open: list[Span] = []

    def start(self, name: str, *, client: bool = False, **attributes: Any) -> Span:
        span = self._tracer.start_span(
            name,
            context=self._ctx,
            kind=SpanKind.CLIENT if client else SpanKind.INTERNAL,
            attributes={k.replace("__", "."): v for k, v in attributes.items() if v is not None},
        )
        self._open.append(span)
        return span

    def end(self, span: Span, error: str | None = None, **attributes: Any) -> None:
        for k, v in attributes.items():
            if v is not None:
                span.set_attribute(k.replace("__", "."), v)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()
        with contextlib.suppress(ValueError):
            self._open.remove(span)

    @staticmethod
    def headers(span: Span) -> dict[str, str]:
        """``traceparent`` (and ``tracestate``) naming ``span``, for the upstream request."""
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=set_span_in_context(span))
        return carrier

    def set(self, **attributes: Any) -> None:
        for k, v in attributes.items():
            if v is not None:
                self.root.set_attribute(k.replace("__", "."), v)

    # -- the request path's named calls (see Trace) ------------------------------------------
    def begin_step(self, name: str) -> Span:
        return self.start(name)

    def authenticated(self, span: Span, tenant: str) -> None:
        self.end(span, tokenplane__tenant=tenant)

    def described(self, tenant: str, model: str, stream: bool, info: RequestInfo) -> None:
        wf = info.workflow
        self.set(
            tokenplane__tenant=tenant,
            tokenplane__model=model,
            tokenplane__stream=stream,
            tokenplane__request_id=info.request_id,
            tokenplane__workflow__id=wf.workflow_id if wf is not None else None,
            tokenplane__workflow__step=wf.step if wf is not None else None,
            tokenplane__tokens__prompt=info.prompt_tokens,
        )

    def begin_admission(self, priority: PriorityClass) -> Span:
        return self.start("tokenplane.admission", tokenplane__priority=priority.label)

    def admitted(self, span: Span, started_s: float) -> None:
        self.end(span, tokenplane__queue_wait_s=time.monotonic() - started_s)

    def routed(self, span: Span, instance: str, reason: str) -> None:
        self.end(span, tokenplane__instance=instance, tokenplane__route__reason=reason)

    def begin_attempt(self, instance: str, number: int, kind: AttemptKind, tokens_in: int) -> Span:
        return self.start(
            "tokenplane.continuation" if kind is AttemptKind.CONTINUATION else "tokenplane.upstream",
            client=True,
            tokenplane__instance=instance,
            tokenplane__attempt__number=number,
            tokenplane__attempt__kind=kind.value,
            tokenplane__tokens__prompt=tokens_in,
        )

    def end_attempt(
        self, span: Span, error: str | None, result: str, tokens_out: int, cost_usd: float
    ) -> None:
        self.end(
            span,
            error=error,
            tokenplane__attempt__result=result,
            tokenplane__tokens__output=tokens_out,
            tokenplane__cost_usd=cost_usd,
        )

    def refused(self, status: int) -> None:
        self.set(http__response__status_code=status)

    def finish(self, outcome: str) -> None:
        """End the request's span (and any child an exception left open) with the request's outcome."""
        for span in list(self._open):
            self.end(span, error=outcome)
        root = self.root
        root.set_attribute("tokenplane.outcome", outcome)
        if outcome != "ok":
            root.set_status(Status(StatusCode.ERROR, outcome))
        elif root.is_recording():
            root.set_attribute("http.response.status_code", 200)
        root.end()
