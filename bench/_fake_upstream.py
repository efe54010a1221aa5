"""A fast fake OpenAI upstream for ``gateway_overhead.py``: raw asyncio protocol, HTTP/1.1 keep-alive.

It must cost as little CPU as possible (it shares a core with the load generator), so it does no
JSON work on the request path: the answer is pre-encoded, and a request is streamed when its body
contains ``"stream":true`` (the load generator encodes compactly). Streams are chunked-encoded SSE:
``--chunks`` ``chat.completion.chunk`` events, a usage event when ``"include_usage":true``, then
``data: [DONE]``; each event is one ``transport.write``, spaced ``--delay-ms`` apart (0: all at
once, as separate writes). ``GET /metrics`` answers a small vLLM-style exposition, ``GET /health`` ok.

Usage: ``python bench/_fake_upstream.py --ports 9001,9002 --chunks 64 --delay-ms 10``
(prints ``ready`` on stdout once every port listens).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

_OK = b"HTTP/1.1 200 OK\r\n"
_MODEL = "bench-model"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _events(chunks: int) -> tuple[list[bytes], bytes, bytes]:
    """(token events, usage event, [DONE] event), each already a chunked-encoding frame."""
    head = b'data: {"id":"cmpl-bench","object":"chat.completion.chunk","created":0,"model":"'
    head += _MODEL.encode()
    toks = []
    for i in range(chunks):
        finish = b'"stop"' if i == chunks - 1 else b"null"
        role = b'"role":"assistant",' if i == 0 else b""
        toks.append(
            _chunk(
                head
                + b'","choices":[{"index":0,"delta":{'
                + role
                + b'"content":" tok"},"logprobs":null,"finish_reason":'
                + finish
                + b"}]}\n\n"
            )
        )
    usage = _chunk(
        head
        + b'","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":%d,"total_tokens":%d}}\n\n'
        % (chunks, chunks + 100)
    )
    return toks, usage, _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def _json_response(chunks: int) -> bytes:
    body = (
        b'{"id":"cmpl-bench","object":"chat.completion","created":0,"model":"'
        + _MODEL.encode()
        + b'","choices":[{"index":0,"message":{"role":"assistant","content":"'
        + b" tok" * chunks
        + b'"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":100,'
        + b'"completion_tokens":%d,"total_tokens":%d}}' % (chunks, chunks + 100)
    )
    return _OK + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body


def _plain(status: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (
        status,
        len(body),
        body,
    )


_METRICS = (
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{model_name="bench-model"} 1.0\n'
    b"# TYPE vllm:num_requests_waiting gauge\n"
    b'vllm:num_requests_waiting{model_name="bench-model"} 0.0\n'
    b"# TYPE vllm:kv_cache_usage_perc gauge\n"
    b'vllm:kv_cache_usage_perc{model_name="bench-model"} 0.1\n'
    b"# TYPE vllm:prefix_cache_queries counter\n"
    b'vllm:prefix_cache_queries_total{model_name="bench-model"} 10.0\n'
    b"# TYPE vllm:prefix_cache_hits counter\n"
    b'vllm:prefix_cache_hits_total{model_name="bench-model"} 5.0\n'
)
_SSE_HEAD = _OK + (
    b"Content-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
)


class UpstreamProtocol(asyncio.Protocol):
    """One keep-alive connection; requests are answered in order (no pipelining needed)."""

    def __init__(self, chunks: int, delay_s: float) -> None:
        self.chunks = chunks
        self.delay_s = delay_s
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.streaming = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while not self.streaming:
            buf = self.buf
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = buf[:end]
            length = 0
            i = head.lower().find(b"content-length:")
            if i >= 0:
                j = head.find(b"\r\n", i)
                length = int(head[i + 15 : j if j >= 0 else len(head)])
            total = end + 4 + length
            if len(buf) < total:
                return
            body = buf[end + 4 : total]
            self.buf = buf[total:]
            self.handle(head[: head.find(b"\r\n")], body)

    def handle(self, line: bytes, body: bytes) -> None:
        t = self.transport
        if t is None:
            return
        if line.startswith(b"GET /metrics"):
            t.write(_plain(b"200 OK", _METRICS))
        elif line.startswith(b"GET /health"):
            t.write(_plain(b"200 OK", b"ok"))
        elif line.startswith(b"POST /v1/"):
            if b'"stream":true' in body:
                self.start_stream(b'"include_usage":true' in body)
            else:
                t.write(JSON_RESPONSE)
        else:
            t.write(_plain(b"404 Not Found", b"not found"))

    def start_stream(self, usage: bool) -> None:
        assert self.transport is not None
        self.streaming = True
        self.transport.write(_SSE_HEAD)
        tail = [USAGE, DONE] if usage else [DONE]
        frames = [*TOKENS, *tail]
        if self.delay_s <= 0:
            for f in frames:
                self.transport.write(f)
            self.end_stream()
            return
        it = iter(frames)
        loop = asyncio.get_running_loop()

        def step() -> None:
            self.timer = None
            t = self.transport
            if t is None:
                return
            f = next(it, None)
            if f is None:
                self.end_stream()
                return
            t.write(f)
            # Usage and [DONE] follow the last token at once, as a runtime sends them.
            if f is TOKENS[-1] or f is USAGE:
                step()
            else:
                self.timer = loop.call_later(self.delay_s, step)

        step()

    def end_stream(self) -> None:
        self.streaming = False
        if self.buf:
            self.data_received(b"")


TOKENS: list[bytes] = []
USAGE = b""
DONE = b""
JSON_RESPONSE = b""


async def main() -> None:
    global TOKENS, USAGE, DONE, JSON_RESPONSE
    p = argparse.ArgumentParser()
    p.add_argument("--ports", required=True)
    p.add_argument("--chunks", type=int, default=64)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--cpu", type=int, default=None)
    a = p.parse_args()
    if a.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {a.cpu})
    TOKENS, USAGE, DONE = _events(a.chunks)
    JSON_RESPONSE = _json_response(a.chunks)
    loop = asyncio.get_running_loop()
    servers = []
    for port in a.ports.split(","):
        servers.append(
            await loop.create_server(
                lambda: UpstreamProtocol(a.chunks, a.delay_ms / 1000), "127.0.0.1", int(port), backlog=4096
            )
        )
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:  # pragma: no cover
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
