"""Fuzz the reading of an instance's SSE stream: :func:`tokenplane.gateway.proxy.scan_events`
over the batches :class:`~tokenplane.gateway.proxy.SseReader` cuts, and the stream splicer
(``gateway/continuation.py``) that parses what was delivered after a failure and rewrites a
continuation's events.

Each input is an upstream body: the first byte picks how it is cut into reads, the second where
the first attempt ends and the continuation begins. Properties:

1. ``scan_events`` forwards whole events only (``buf[:fwd]`` ends at an event boundary), all of
   them unless it saw ``[DONE]`` or a malformed event, and its span of the last JSON payload is
   a ``{...}`` inside the batch;
2. its fast path (one whole token event) agrees with the general loop on the same bytes;
3. the splicer's ``digest`` and ``_rewrite`` take any bytes the scanner forwards without
   raising, and a rewritten chunk is whole ``data:`` events of JSON objects.

Run: ``python fuzz/run.py --seconds 600 sse_scanner``.
"""

from __future__ import annotations

import asyncio
import sys

import atheris
import msgspec
from multidict import CIMultiDict, CIMultiDictProxy

from tokenplane.gateway import continuation, proxy
from tokenplane.gateway.continuation import StreamSplicer
from tokenplane.gateway.edges.fast_request import FastRequest
from tokenplane.gateway.proxy import MAX_PENDING_EVENT_BYTES, scan_events

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _support import RecordingTransport, instrument, write_seeds

instrument(proxy, continuation)

LOOP = asyncio.new_event_loop()
asyncio.set_event_loop(LOOP)


def check_scan(buf: bytes, end: int) -> tuple[int, bool, int, bool]:
    fwd, done, n, span, malformed = scan_events(buf, end)
    assert 0 <= fwd <= end and n >= 0, (fwd, end, n)
    assert not (done and malformed)
    if not done and not malformed:
        assert fwd == end, (fwd, end, buf)
    assert fwd == 0 or buf[fwd - 2 : fwd] == b"\n\n", (fwd, buf)
    if done:
        assert buf[:fwd].rstrip(b"\r \n").endswith(b"[DONE]"), buf[:fwd]
    if span is not None:
        p, q = span
        assert 0 <= p < q <= end and buf[p] == 0x7B and buf[q - 1] == 0x7D, (span, buf)
    # The general loop over the same batch (a byte past ``end`` turns the fast path off).
    slow = scan_events(buf + b"\n", end)
    assert slow == (fwd, done, n, span, malformed), (slow, (fwd, done, n, span, malformed), buf)
    return fwd, done, n, malformed


def batches(body: bytes, cut: int) -> list[tuple[bytes, int]]:
    """What ``SseReader.next_batch`` returns for ``body`` arriving in pieces of ``cut`` bytes."""
    out = []
    pending = b""
    pos = 0
    while pos < len(body):
        piece = body[pos : pos + cut] if cut else body[pos:]
        pos += len(piece)
        buf = pending + piece
        end = buf.rfind(b"\n\n") + 2
        if end < 2:
            if len(buf) > MAX_PENDING_EVENT_BYTES:
                return out
            pending = buf
            continue
        pending = buf[end:]
        out.append((buf, end))
    return out


def relay(splicer: StreamSplicer, body: bytes, cut: int, splice: bool) -> None:
    for buf, end in batches(body, cut):
        fwd, done, _n, malformed = check_scan(buf, end)
        if fwd:
            chunk = buf[:fwd]
            if splice:
                out, _, bad = splicer._rewrite(chunk, 0)
                for event in out.split(b"\n\n")[:-1]:
                    assert event == b"data: [DONE]" or (
                        event.startswith(b"data: {") and type(msgspec.json.decode(event[6:])) is dict
                    ), event
                if bad:
                    return  # the relay ends the attempt as malformed
            else:
                splicer._sent.append(chunk)
        if done or malformed:
            return


def TestOneInput(data: bytes) -> None:
    if len(data) < 2:
        return
    cut, split, body = data[0] % 64, data[1], data[2:]
    at = len(body) * split // 255
    t = RecordingTransport()
    client = FastRequest("POST", "/v1/chat/completions", CIMultiDictProxy(CIMultiDict()), b"", t)
    splicer = StreamSplicer(client, chat=bool(split & 1))
    relay(splicer, body[:at], cut, splice=False)
    splicer.digest()
    relay(splicer, body[at:], cut, splice=True)


def _event(obj: object) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


def seeds() -> list[bytes]:
    """Streams as vLLM and the emulator send them, and broken ones, built here."""
    head = {"id": "cmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    role = _event({**head, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
    toks = b"".join(
        _event({**head, "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]})
        for i in range(4)
    )
    fin = _event({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    usage = _event({**head, "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4}})
    text = _event({"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "x"}]})
    done = b"data: [DONE]\n\n"
    whole = role + toks + fin + usage + done
    bodies = [
        whole,
        toks + toks + done,
        text + text + done,
        b": keep-alive\n\n" + whole,
        b'data:{"a":1}\r\n\n' + done,
        b"data: {this is not json\n\n" + done,
        b'data: {"a": 1}\n\ndata: [DONE] \r\n\n',
        b"event: message\ndata: {}\n\n",
        b"\n\n\n\n" + toks,
        b"data: " + b"{" * 40 + b"\n\n",
        toks[:-1],
    ]
    return [bytes([i * 7 % 64, (i * 37) % 256]) + b for i, b in enumerate(bodies)]


if __name__ == "__main__":
    # The harness's own checks too: coverage to steer by even where the gateway is compiled.
    instrument(sys.modules[__name__])
    write_seeds(sys.argv, seeds())
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
