"""The fast front's head check: header names compared case-blind, whatever their spelling."""

from __future__ import annotations

import pytest

from tokenplane.gateway.edges.fast_front import _parse_head

LINE = b"POST /v1/chat/completions HTTP/1.1"


def _head(*fields: bytes) -> bytes:
    return LINE + b"".join(b"\r\n" + f for f in fields)


@pytest.mark.parametrize(
    "fields",
    [
        (b"HOST: a", b"host: b", b"Content-Length: 2"),  # two Hosts
        (b"Host: a", b"CONTENT-LENGTH: 2", b"content-length: 2"),  # two lengths
        (b"Host: a", b"Content-Length: 2", b"TRANSFER-ENCODING: chunked"),
        (b"Host: a", b"Content-Length: 2", b"eXpEcT: 100-continue"),
        (b"Host: a", b"Content-Length: 2", b"UpGrade: h2c"),
        (b"Host: a", b"Content-Length: 2", b"User-Agent: x", b"USER-AGENT: y"),  # a singleton twice
        (b"Content-Length: 2",),  # no Host
        (b"Host: a", b"Content-Length: -2"),
        (b"Host: a", b"Content-Length: 2, 2"),
    ],
)
def test_heads_aiohttp_must_answer_are_handed_over(fields: tuple[bytes, ...]) -> None:
    assert _parse_head(_head(*fields)) is None


def test_a_head_in_the_fast_shape_keeps_its_names_and_values_as_sent() -> None:
    head = _head(b"hOsT: A.example", b"CONTENT-length:  12", b"Content-Type: Application/JSON", b"X-Y:\tv ")
    assert _parse_head(head) == (
        "chat",
        "/v1/chat/completions",
        [("hOsT", "A.example"), ("CONTENT-length", "12"), ("Content-Type", "Application/JSON"), ("X-Y", "v")],
        12,
    )
