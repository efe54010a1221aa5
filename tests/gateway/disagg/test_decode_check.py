"""The decode answer's check for a failed KV load, over a fake reply that hands out given pieces:
what it lets through is replayed whole, byte for byte; an error before the first token stops it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenplane.gateway.config import HealthConfig, InstanceConfig
from tokenplane.gateway.disagg.decode_check import check_plain, check_stream
from tokenplane.gateway.errors import KvTransferFailed
from tokenplane.gateway.upstreams import Upstream

pytestmark = pytest.mark.anyio

ROLE = b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOKEN = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":" lorem"}}]}\n\n'
ERROR = b'data: {"error":{"message":"Internal server error","type":"InternalServerError","code":500}}\n\n'
DONE = b"data: [DONE]\n\n"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeReply:
    def __init__(self, pieces: list[bytes], status: int = 200) -> None:
        self.pieces = list(pieces)
        self.status = status
        self.headers: Mapping[str, str] = {}
        self.closed = False

    async def readany(self) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""

    async def read(self) -> bytes:
        out = b"".join(self.pieces)
        self.pieces = []
        return out

    async def read_some(self, n: int) -> bytes:
        return (await self.read())[:n]

    def park(self, sink: object) -> None:
        return None

    def close(self) -> None:
        self.closed = True


UPSTREAM = Upstream(InstanceConfig(id="d0", url="http://127.0.0.1:1", model="m", role="both"), HealthConfig())


async def drain(reply: object) -> bytes:
    out = b""
    while piece := await reply.readany():  # type: ignore[attr-defined]
        out += piece
    return out


async def test_a_stream_is_replayed_whole_once_its_first_token_came() -> None:
    body = [ROLE, TOKEN[:20], TOKEN[20:] + TOKEN, DONE]
    reply = await check_stream(FakeReply(body), UPSTREAM)
    assert reply.park(lambda b: 0) is None  # the head is replayed first, not parked
    assert await drain(reply) == b"".join(body)


async def test_an_error_event_before_the_first_token_is_a_failed_kv_load() -> None:
    with pytest.raises(KvTransferFailed, match="d0 could not load the prefilled KV"):
        await check_stream(FakeReply([ROLE, ERROR, DONE]), UPSTREAM)
    with pytest.raises(KvTransferFailed):
        await check_plain(FakeReply([b'{"error":{}}'], status=500), UPSTREAM)


async def test_other_answers_pass_to_the_usual_handling() -> None:
    for status in (400, 503):  # a refusal, an instance down: the attempt's own rules judge them
        assert (await check_stream(FakeReply([b"{}"], status=status), UPSTREAM)).status == status
    ended = await check_stream(FakeReply([ROLE]), UPSTREAM)  # ended before a token: the relay says how
    assert await drain(ended) == ROLE


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from([ROLE, TOKEN, DONE]), min_size=1, max_size=6),
    st.lists(st.integers(1, 400), max_size=5, unique=True),
)
def test_any_split_of_a_good_stream_is_replayed_exactly(events: list[bytes], cuts: list[int]) -> None:
    body = b"".join(events)
    edges = sorted(c for c in cuts if c < len(body))
    pieces = [body[a:b] for a, b in zip([0, *edges], [*edges, len(body)], strict=True) if body[a:b]]

    async def run() -> bytes:
        return await drain(await check_stream(FakeReply(pieces), UPSTREAM))

    assert asyncio.run(run()) == body
