"""One client stream over several upstream attempts: pass-through first, splicing after a failure.

The first attempt's SSE bytes go to the client untouched (whole events only, as
:func:`~tokenplane.gateway.proxy.scan_events` finds them); the splicer only keeps references to the
forwarded byte strings. Nothing is parsed while nothing fails. From the first token on, the usual
piece (whole token events) does not even wake the relay: the upstream connection hands it to a sink
that writes it to the client's transport in the protocol callback (:meth:`SseReader.park
<tokenplane.gateway.proxy.SseReader.park>`); the relay loop handles the rest (the end, a partial or
malformed event, a full write buffer, silence).

When an attempt fails after the client's stream started (connection dropped, malformed or truncated
SSE, no final chunk), :meth:`StreamSplicer.digest` parses what was already delivered, once: the
stream's ``id``/``created``/``model``, the text, and the number of tokens. The next attempt is a
continuation (:func:`continuation_body`): completions get the prompt plus the delivered text; chat
gets the messages plus a partial assistant message holding it, with vLLM's
``continue_final_message: true, add_generation_prompt: false``; ``max_tokens`` (and ``min_tokens``)
shrink by the tokens delivered. Its events are rewritten before they are written: the first
attempt's ``id``, ``created`` and ``model``; its opening role-only chunk dropped (the client had
one); usage rewritten to what the request really cost: ``completion_tokens`` = tokens delivered in
total, ``prompt_tokens`` = the first attempt's prompt (the continuation's prompt tokens minus the
tokens delivered before it, an estimate: re-tokenising the delivered text may merge a token or two),
and ``usage.tokenplane = {attempts, continuation_prompt_tokens}``.

Token counting assumption: one SSE chunk carrying content is one token. vLLM and the emulator send
one chunk per generated token (vLLM skips chunks whose detokenised delta is empty, e.g. half a UTF-8
character, so the count can be a little low; ``max_tokens`` of the continuation is then a little
high, never low). With ``stream_options.continuous_usage_stats`` the chunks' own
``usage.completion_tokens`` is used instead.

Continuation is not attempted (the stream ends with the error) for ``n > 1``, completions with
``echo``, and completions prompts that are token ids or several prompts.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable, Iterable
from time import monotonic
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from tokenplane.gateway.edges.base import ClientStream
from tokenplane.gateway.edges.chunked import WRITE_HIGH_WATER_BYTES, ChunkedBody
from tokenplane.gateway.errors import (
    GatewayError,
    UpstreamProtocolError,
    error_event,
)
from tokenplane.gateway.proxy import (
    OUTCOME_CLIENT_GONE,
    SSE_HEADERS,
    SseReader,
    scan_events,
)
from tokenplane.gateway.request import ParsedRequest
from tokenplane.gateway.runtimes import DEFAULT_RUNTIME, Runtime
from tokenplane.gateway.stages.context import RequestContext
from tokenplane.gateway.transports.base import UpstreamReply
from tokenplane.gateway.transports.httptools_client import SINK_DECLINED, SINK_TAKEN, SINK_TAKEN_WAKE
from tokenplane.gateway.upstreams import Upstream

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_DONE = b"data: [DONE]\n\n"


def can_continue(parsed: ParsedRequest, runtimes: Iterable[Runtime] = (DEFAULT_RUNTIME,)) -> bool:
    """Whether a broken stream of ``parsed`` can be continued on every runtime it may be routed to
    (the pool's; by default vLLM's, what the gateway assumed before runtimes were adapters)."""
    return all(r.can_continue(parsed.endpoint, parsed.body) for r in runtimes)


def continuation_body(
    parsed: ParsedRequest, text: str, tokens: int, runtime: Runtime = DEFAULT_RUNTIME
) -> dict[str, Any]:
    """The request that continues ``parsed`` after ``text`` (``tokens`` tokens) was delivered, as
    ``runtime`` takes it. Ask :func:`can_continue` first: a runtime that cannot continue raises."""
    body = runtime.continuation(parsed.endpoint, parsed.body, text, tokens)
    if body is None:
        raise ValueError(f"a {runtime.kind} instance cannot continue a {parsed.endpoint} stream")
    return body


class AttemptEnd(msgspec.Struct):
    """How one stream attempt ended, as the splicer saw it."""

    failure: GatewayError | None
    tokens: int  # content chunks this attempt delivered
    latency_s: float | None  # attempt start to its first content chunk
    client_gone: bool = False


class StreamSplicer:
    """The client's one SSE response and what has been delivered on it."""

    __slots__ = (
        "_chat",
        "_sent",
        "attempts",
        "client",
        "cont_prompt_tokens",
        "delivered_text",
        "delivered_tokens",
        "digested",
        "finished",
        "first_prompt_tokens",
        "head",
        "idle_timeout_s",
        "left_after",
    )

    def __init__(self, client: ClientStream, chat: bool, idle_timeout_s: float | None = None) -> None:
        self.client = client
        self.idle_timeout_s = idle_timeout_s
        self._chat = chat
        self._sent: list[bytes] = []
        self.digested = False
        self.delivered_text: list[str] = []
        self.delivered_tokens = 0
        self.head: dict[str, Any] | None = None
        self.finished = False
        self.attempts = 0
        self.cont_prompt_tokens = 0
        self.first_prompt_tokens: int | None = None
        self.left_after: AttemptEnd | None = None  # a relay that ended as its caller was cancelled

    @property
    def started(self) -> bool:
        return self.client.streaming

    @property
    def out(self) -> web.StreamResponse:
        """What the handler returns for the client's stream."""
        return self.client.answer()

    @property
    def text(self) -> str:
        return "".join(self.delivered_text)

    # -- after a failure ------------------------------------------------------------------------
    def digest(self) -> None:
        """Parse what the pass-through attempt delivered (once; later attempts are parsed live)."""
        if self.digested:
            return
        data = b"".join(self._sent)
        self._sent = []
        for raw in data.split(b"\n\n"):
            payload = _payload(raw)
            if payload is None:
                continue
            try:
                obj = _decode(payload)
            except msgspec.DecodeError:
                continue
            if type(obj) is dict:
                self._observe(obj)
        self.digested = True

    def _observe(self, obj: dict[str, Any]) -> bool:
        """Record one delivered chunk; True when it carried content."""
        if self.head is None and "id" in obj:
            self.head = {k: obj[k] for k in ("id", "created", "model", "system_fingerprint") if k in obj}
        usage = obj.get("usage")
        choices = obj.get("choices")
        content = False
        if type(choices) is list and choices and type(choices[0]) is dict:
            c = choices[0]
            if self._chat:
                delta = c.get("delta")
                piece = delta.get("content") if type(delta) is dict else None
            else:
                piece = c.get("text")
            if type(piece) is str and piece:
                self.delivered_text.append(piece)
                self.delivered_tokens += 1
                content = True
            if c.get("finish_reason") is not None:
                self.finished = True
        elif type(usage) is dict and not self.digested and self.first_prompt_tokens is None:
            pt = usage.get("prompt_tokens")
            if type(pt) is int:
                self.first_prompt_tokens = pt
        return content

    # -- relaying ---------------------------------------------------------------------------------
    async def relay(self, resp: UpstreamReply, ex: RequestContext, upstream: Upstream) -> AttemptEnd:
        """Relay one attempt's SSE body onto the client's stream (pass-through unless digested).

        The relay loop runs as a task of its own. Awaited in place, each of a stream's chunks
        would resume the whole chain of coroutines above it (handler, retry loop, attempt...), ten
        frames deep; in its own task a chunk resumes three. (Parked, the usual chunk resumes none;
        awaiting in place would save ~2 % of a decode-like stream's instructions and cost every
        chunk that is not parked, e.g. from an ``https://`` instance, seven frames.) Cancelling the
        caller (the client left) cancels the relay and waits for it, so the caller's clean-up runs
        after the relay's.
        """
        task = asyncio.get_running_loop().create_task(self._relay(resp, ex, upstream))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            task.cancel()
            cancelled = exc
        # Waited for outside the handler: an await inside an ``except`` block that then re-raises
        # corrupts memory once compiled by mypyc (the compiled build crashed in tests).
        await asyncio.wait([task])
        if not task.cancelled() and task.exception() is None:
            # The relay had finished (e.g. written [DONE]) when the client left: its end is kept
            # for the attempt's record.
            self.left_after = task.result()
        raise cancelled

    async def _relay(self, resp: UpstreamReply, ex: RequestContext, upstream: Upstream) -> AttemptEnd:
        self.attempts += 1
        splice = self.digested
        started = time.monotonic()
        done = False
        tokens = 0
        first_s: float | None = None
        failure: GatewayError | None = None
        base_tokens = self.delivered_tokens
        reader = SseReader(resp, upstream)
        idle_s = self.idle_timeout_s  # armed at the first token
        client = self.client
        sink: Callable[[bytes], int] | None = None
        body: ChunkedBody | None = None  # the client's stream once its head went out
        if not splice:
            sent = self._sent  # (digest replaces the list only after this attempt)

            def sink(data: bytes) -> int:
                """The usual piece, whole token events, straight to the client from the upstream
                connection's callback (see :meth:`SseReader.park`)."""
                nonlocal tokens
                size = len(data)
                if data.endswith(b"}\n\n") and data.startswith(b"data: {") and data.find(b"\n\n") == size - 2:
                    n = 1  # the usual piece: one token event (scan_events' own first case)
                else:
                    if not data.endswith(b"\n\n"):
                        return SINK_DECLINED
                    _fwd, fin, n, _span, malformed = scan_events(data, size)
                    if fin or malformed:  # the loop below handles the end, and what is wrong
                        return SINK_DECLINED
                assert body is not None  # parked only once it is there
                backlog = body.put(data)
                if backlog < 0:
                    return SINK_DECLINED
                tokens += n
                sent.append(data)
                reader.last_at = upstream.heard_at = monotonic()  # reader.heard(), one call less a piece
                return SINK_TAKEN_WAKE if backlog > WRITE_HIGH_WATER_BYTES else SINK_TAKEN

        parked = False  # from the first token on, once the client's stream is chunked
        try:
            await client.open_stream(SSE_HEADERS)
            while not done:
                if parked:
                    assert sink is not None
                    stalled = await reader.park(sink)
                    if stalled is not None:
                        failure = stalled
                        break
                    if client.backlog() > WRITE_HIGH_WATER_BYTES:
                        await client.drain()
                got = await reader.next_batch()
                if isinstance(got, GatewayError):
                    failure = got
                    break
                buf, end = got
                fwd, done, n, _span, malformed = scan_events(buf, end)
                if fwd:
                    chunk = buf[:fwd] if fwd < len(buf) else buf
                    if splice:
                        chunk, n, bad = self._rewrite(chunk, base_tokens)
                        malformed = malformed or bad
                    else:
                        self._sent.append(chunk)
                    if chunk:
                        if body is None:
                            body = client.chunks
                        backlog = -1 if body is None else body.put(chunk)  # the usual chunk: no coroutine
                        if backlog < 0:
                            await client.write(chunk)
                        elif backlog > WRITE_HIGH_WATER_BYTES:
                            await client.drain()
                    if n:
                        tokens += n
                        if first_s is None:
                            first_s = time.monotonic() - started
                            if idle_s is not None:
                                reader.arm(idle_s)
                        if ex.ttft_s is None:
                            ex.ttft_s = time.monotonic() - ex.arrival
                if malformed:
                    failure = UpstreamProtocolError(f"instance {upstream.id} sent a malformed event")
                    break
                if body is None:
                    body = client.chunks  # the first write sent the head
                if done:
                    ex.answered = True
                parked = sink is not None and first_s is not None and body is not None
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            ex.outcome = OUTCOME_CLIENT_GONE
            return AttemptEnd(None, tokens, first_s, client_gone=True)
        if not splice:
            ex.events_sent += tokens  # pass-through: JSON events (a close upper bound of tokens)
        if failure is not None:
            self.digest()
            if self.finished:  # the final chunk arrived; only [DONE] (or usage) was lost
                await self.finish()
                ex.answered = True
                return AttemptEnd(None, tokens, first_s)
            return AttemptEnd(failure, self.delivered_tokens - base_tokens, first_s)
        if splice:
            ex.events_sent = self.delivered_tokens
        return AttemptEnd(None, tokens, first_s)

    def _rewrite(self, chunk: bytes, base_tokens: int) -> tuple[bytes, int, bool]:
        """Rewrite a continuation's events onto the client's stream; returns (bytes, content chunks,
        malformed). The scanner passes ``data: {...}`` without parsing it: an event that is not
        JSON ends the rewrite there, as a malformed event ends a pass-through attempt."""
        out: list[bytes] = []
        n = 0
        for raw in chunk.split(b"\n\n"):
            if not raw:
                continue
            payload = _payload(raw)
            if payload is None:
                if raw.strip() == b"data: [DONE]":
                    out.append(_DONE)
                continue  # comments and blank lines are not worth keeping across a splice
            try:
                obj = _decode(payload)
            except msgspec.DecodeError:  # found by fuzz/fuzz_sse_scanner.py
                return b"".join(out), n, True
            if type(obj) is not dict:
                continue
            choices = obj.get("choices")
            usage = obj.get("usage")
            has_choice = type(choices) is list and bool(choices)
            if has_choice and self._chat and choices is not None:
                c = choices[0] if type(choices[0]) is dict else {}
                delta = c.get("delta")
                if (
                    type(delta) is dict
                    and not delta.get("content")
                    and not delta.get("tool_calls")
                    and c.get("finish_reason") is None
                ):
                    continue  # the continuation's opening role chunk: the client already has one
            if self._observe(obj):
                n += 1
            if self.head is not None:
                obj.update(self.head)
            if type(usage) is dict:
                # The upstream's own count for this attempt (continuous usage stats, or the final
                # usage chunk) beats counting content chunks: a runtime's detokeniser may hold a
                # token back and send two in one chunk.
                ct = usage.get("completion_tokens")
                if type(ct) is int:
                    self.delivered_tokens = base_tokens + ct
                obj["usage"] = self._usage(usage, base_tokens)
            out.append(b"data: " + _encode(obj) + b"\n\n")
        return b"".join(out), n, False

    def _usage(self, usage: dict[str, Any], base_tokens: int) -> dict[str, Any]:
        pt = usage.get("prompt_tokens")
        cont_pt = pt if type(pt) is int else 0
        first = self.first_prompt_tokens
        if first is None:
            first = max(0, cont_pt - base_tokens)
        completion = self.delivered_tokens
        return {
            **usage,
            "prompt_tokens": first,
            "completion_tokens": completion,
            "total_tokens": first + completion,
            "tokenplane": {
                "attempts": self.attempts,
                "continuation_prompt_tokens": self.cont_prompt_tokens + cont_pt,
            },
        }

    async def finish(self) -> None:
        client = self.client
        await client.open_stream(SSE_HEADERS)
        await client.write(_DONE)
        await client.end_stream()

    async def fail(self, exc: GatewayError) -> web.StreamResponse:
        """End the client's stream with an OpenAI-style error event (built in errors.py)."""
        client = self.client
        await client.open_stream(SSE_HEADERS)
        try:
            await client.write(error_event(exc))
            await client.end_stream()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass
        return client.answer()

    async def end_length(self, ex: RequestContext) -> None:
        """Every token asked for was delivered but the final chunk was lost: send it ourselves."""
        head = self.head or {}
        if self._chat:
            choice: dict[str, Any] = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
            obj = "text_completion"
        event = {"object": obj, **copy.copy(head), "choices": [choice]}
        await self.client.open_stream(SSE_HEADERS)
        await self.client.write(b"data: " + _encode(event) + b"\n\n")
        self.finished = True
        await self.finish()
        ex.answered = True


def _payload(raw: bytes) -> bytes | None:
    raw = raw.strip()
    if not raw.startswith(b"data:"):
        return None
    p = raw[5:].strip()
    return p if p.startswith(b"{") else None
