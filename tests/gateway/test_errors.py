"""Bad input and failing instances: each gets the right status and an OpenAI-style error body, and
the gateway keeps serving afterwards."""

from __future__ import annotations

import ast
import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import msgspec
import openai
import pytest

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


def _m(**kw):
    return {"model": "llama-3-8b", "messages": MSG, **kw}


# (path, body or raw bytes, key, status, error.type, error.code, error.param)
BAD_INPUTS = [
    (CHAT, b"{not json", "ok", 400, "invalid_request_error", "invalid_json", None),
    (CHAT, b"", "ok", 400, "invalid_request_error", "invalid_json", None),
    (CHAT, b"[1, 2]", "ok", 400, "invalid_request_error", "invalid_json", None),
    (CHAT, {"messages": MSG}, "ok", 400, "invalid_request_error", "missing_required_parameter", "model"),
    (CHAT, {"model": 3, "messages": MSG}, "ok", 400, "invalid_request_error", "invalid_type", "model"),
    (
        CHAT,
        {"model": "llama-3-8b"},
        "ok",
        400,
        "invalid_request_error",
        "missing_required_parameter",
        "messages",
    ),
    (CHAT, _m(messages="hi"), "ok", 400, "invalid_request_error", "invalid_type", "messages"),
    (CHAT, _m(messages=[]), "ok", 400, "invalid_request_error", "invalid_type", "messages"),
    (
        CHAT,
        _m(messages=[{"content": "x"}]),
        "ok",
        400,
        "invalid_request_error",
        "invalid_type",
        "messages[0].role",
    ),
    (
        CHAT,
        _m(messages=[{"role": "user", "content": 5}]),
        "ok",
        400,
        "invalid_request_error",
        "invalid_type",
        "messages[0].content",
    ),
    (CHAT, _m(max_tokens="10"), "ok", 400, "invalid_request_error", "invalid_type", "max_tokens"),
    (CHAT, _m(max_tokens=0), "ok", 400, "invalid_request_error", "invalid_value", "max_tokens"),
    (CHAT, _m(stream="yes"), "ok", 400, "invalid_request_error", "invalid_type", "stream"),
    (CHAT, _m(temperature="hot"), "ok", 400, "invalid_request_error", "invalid_type", "temperature"),
    (CHAT, _m(temperature=7), "ok", 400, "invalid_request_error", "invalid_type", "temperature"),
    (CHAT, _m(stop=[1]), "ok", 400, "invalid_request_error", "invalid_type", "stop"),
    (
        CHAT,
        _m(stream_options={"include_usage": True}),
        "ok",
        400,
        "invalid_request_error",
        "invalid_request",
        "stream_options",
    ),
    (CHAT, _m(max_tokens=5000), "ok", 400, "invalid_request_error", "context_length_exceeded", "max_tokens"),
    (
        CHAT,
        _m(messages=[{"role": "user", "content": "word " * 8000}]),
        "ok",
        400,
        "invalid_request_error",
        "context_length_exceeded",
        "messages",
    ),
    (
        COMP,
        {"model": "llama-3-8b"},
        "ok",
        400,
        "invalid_request_error",
        "missing_required_parameter",
        "prompt",
    ),
    (
        COMP,
        {"model": "llama-3-8b", "prompt": {"a": 1}},
        "ok",
        400,
        "invalid_request_error",
        "invalid_type",
        "prompt",
    ),
    (
        COMP,
        {"model": "llama-3-8b", "prompt": []},
        "ok",
        400,
        "invalid_request_error",
        "invalid_type",
        "prompt",
    ),
    (CHAT, _m(model="no-such-model"), "ok", 404, "invalid_request_error", "model_not_found", "model"),
    (CHAT, _m(), None, 401, "authentication_error", "missing_api_key", None),
    (CHAT, _m(), "wrong", 401, "authentication_error", "invalid_api_key", None),
    (CHAT, b"x" * (70 * 1024), "ok", 413, "invalid_request_error", "request_too_large", None),
]


@pytest.mark.parametrize(("path", "body", "key", "status", "etype", "code", "param"), BAD_INPUTS)
async def test_bad_input(upstreams, gateway, names, path, body, key, status, etype, code, param) -> None:
    ups = await upstreams(1)
    gw = await gateway(ups)
    k = {"ok": names.KEY, None: None}.get(key, key)
    raw = body if isinstance(body, bytes) else None
    got, err, _ = await gw.post(path, None if raw is not None else body, key=k, raw=raw)
    assert got == status, err
    assert set(err["error"]) == {"message", "type", "code", "param"}
    assert err["error"]["type"] == etype
    assert err["error"]["code"] == code
    assert err["error"]["param"] == param
    assert err["error"]["message"]
    assert ups[0].requests == []  # refused at the edge, never forwarded
    # ...and the gateway keeps serving.
    ok, body_ok, _ = await gw.post(CHAT, _m())
    assert ok == 200, body_ok


async def test_restricted_tenant_cannot_see_other_model(upstreams, gateway, names) -> None:
    ups = await upstreams(1)
    gw = await gateway(ups, extra_model=True)
    status, err, _ = await gw.post(CHAT, _m(model=names.OTHER_MODEL), key=names.BATCH_KEY)
    assert status == 404 and err["error"]["code"] == "model_not_found"


async def test_unknown_route_and_method(upstreams, gateway) -> None:
    ups = await upstreams(1)
    gw = await gateway(ups)
    async with gw.http.get(gw.url + "/v1/nothing") as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == "not_found"
    async with gw.http.get(gw.url + CHAT) as resp:
        assert resp.status == 405
        assert (await resp.json())["error"]["code"] == "method_not_allowed"


async def test_openai_client_sees_typed_errors(upstreams, gateway, names) -> None:
    ups = await upstreams(1)
    gw = await gateway(ups)
    with pytest.raises(openai.NotFoundError):
        await gw.client().chat.completions.create(model="nope", messages=MSG)
    with pytest.raises(openai.AuthenticationError):
        await gw.client("bad-key").chat.completions.create(model=names.MODEL, messages=MSG)
    with pytest.raises(openai.BadRequestError) as info:
        await gw.client().chat.completions.create(model=names.MODEL, messages=MSG, max_tokens=100_000)
    assert info.value.code == "context_length_exceeded"


async def test_no_healthy_instance_is_503_with_retry_after(upstreams, gateway, wait) -> None:
    ups = await upstreams(1)
    ups[0].healthy = False
    gw = await gateway(ups)
    await wait(lambda: _unhealthy(gw, "up-0"))
    status, err, headers = await gw.post(CHAT, _m())
    assert status == 503
    assert err["error"]["code"] == "no_healthy_instance"
    assert headers["Retry-After"] == "1"


async def _unhealthy(gw, iid) -> bool:
    return not (await gw.instances())[iid]["healthy"]


async def test_tenant_concurrency_is_429_with_retry_after(upstreams, gateway, names) -> None:
    ups = await upstreams(1)
    ups[0].mode = "hang"
    gw = await gateway(ups)
    first = asyncio.create_task(gw.post(CHAT, _m(), key=names.BATCH_KEY))
    while not ups[0].requests:
        await asyncio.sleep(0.01)
    status, err, headers = await gw.post(CHAT, _m(), key=names.BATCH_KEY)
    assert status == 429 and err["error"]["type"] == "rate_limit_error"
    assert headers["Retry-After"] == "1"
    first.cancel()


async def test_upstream_500_is_502(upstreams, gateway) -> None:
    ups = await upstreams(1)
    ups[0].mode = "fail"
    gw = await gateway(ups, health={"interval_s": 60})
    status, err, _ = await gw.post(CHAT, _m())
    assert status == 502 and err["error"]["code"] == "upstream_unavailable"
    assert (await gw.instances())["up-0"]["consecutive_failures"] == 1


async def test_upstream_400_passes_through(upstreams, gateway) -> None:
    ups = await upstreams(1)
    ups[0].mode = "reject"
    gw = await gateway(ups)
    status, err, _ = await gw.post(CHAT, _m())
    assert status == 400 and err["error"]["param"] == "stop"
    assert (await gw.instances())["up-0"]["consecutive_failures"] == 0


async def test_upstream_unreachable_is_502(upstreams, gateway) -> None:
    ups = await upstreams(1)
    gw = await gateway(ups, health={"interval_s": 60})
    port = ups[0].url.rsplit(":", 1)[1]
    await ups[0].close()
    status, err, _ = await gw.post(CHAT, _m())
    assert status == 502 and err["error"]["type"] == "upstream_error"
    # The client is told which instance, not its address; the operator's view says what happened.
    assert err["error"]["message"] == "instance up-0 is unreachable: UpstreamConnectionError", err
    last_error = (await gw.instances())["up-0"]["last_error"]
    detail = f" (cannot connect to 127.0.0.1:{port}: "
    assert last_error.startswith(err["error"]["message"] + detail), last_error


async def test_upstream_timeout_is_504(upstreams, gateway) -> None:
    ups = await upstreams(1)
    ups[0].mode = "hang"
    gw = await gateway(ups, limits={"upstream_timeout_s": 0.3})
    status, err, _ = await gw.post(CHAT, _m())
    assert status == 504 and err["error"]["code"] == "upstream_timeout"


async def _sse(gw, body) -> tuple[int, list[bytes]]:
    async with gw.http.post(
        gw.url + CHAT, json=body, headers={"Authorization": "Bearer sk-test-acme"}
    ) as resp:
        raw = await resp.read()
    return resp.status, [e for e in raw.split(b"\n\n") if e]


@pytest.mark.parametrize("mode", ["drop", "malformed"])
async def test_broken_upstream_stream_ends_cleanly(upstreams, gateway, names, mode) -> None:
    ups = await upstreams(1)
    ups[0].mode = mode
    gw = await gateway(ups, health={"interval_s": 60, "failures_to_down": 10})
    status, events = await _sse(gw, _m(stream=True))
    assert status == 200
    assert events[-1] == b"data: [DONE]"
    assert events[-2].startswith(b'data: {"error":')
    assert b"upstream_" in events[-2]
    assert all(e.startswith(b"data: {") for e in events[:-1])  # every event well formed
    assert len(events) == 2 + 2  # two good tokens, the error, [DONE]
    # The official client turns the error event into an exception.
    stream = await gw.client().chat.completions.create(model=names.MODEL, messages=MSG, stream=True)
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass
    ups[0].mode = "ok"
    status, events = await _sse(gw, _m(stream=True))
    assert events[-1] == b"data: [DONE]" and b"error" not in b"".join(events)


async def test_gateway_survives_many_failures(upstreams, gateway) -> None:
    ups = await upstreams(2)
    gw = await gateway(ups)
    bodies = [b"{", b"null", b'{"model": []}', b'{"model": "x", "messages": [1]}'] * 5
    results = await asyncio.gather(*(gw.post(CHAT, None, raw=b) for b in bodies))
    assert {r[0] for r in results} == {400}
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/health") as resp:
        assert resp.status == 200


@pytest.mark.parametrize("size_kib", [70, 40])
async def test_chunked_body_is_held_to_the_limit(upstreams, gateway, names, size_kib: int) -> None:
    """Without Content-Length (chunked), the limit applies to the body as received: over it, 413
    and nothing forwarded; under it, served."""
    ups = await upstreams(1)
    gw = await gateway(ups)
    pad = "x" * (size_kib * 1024)
    body = json.dumps({"model": names.MODEL, "messages": [{"role": "user", "content": "hi"}], "user": pad})

    async def chunks() -> AsyncIterator[bytes]:
        data = body.encode()
        for i in range(0, len(data), 8192):
            yield data[i : i + 8192]

    headers = {"Authorization": f"Bearer {names.KEY}", "Content-Type": "application/json"}
    async with gw.http.post(gw.url + CHAT, data=chunks(), headers=headers) as resp:
        got = await resp.json()
        if size_kib * 1024 > 64 * 1024:
            assert resp.status == 413 and got["error"]["code"] == "request_too_large"
            assert ups[0].requests == []
        else:
            assert resp.status == 200, got


async def test_the_instance_reads_what_the_gateway_validated(upstreams, gateway, names) -> None:
    """A key given twice means, to msgspec, its last value; the instance gets the body re-encoded
    from what was validated, never the client's bytes, so no other parser can read the other one."""
    ups = await upstreams(1)
    gw = await gateway(ups)
    raw = (
        b'{"model": "%s", "max_tokens": 100000, "messages": [{"role": "user", "content": "hi"}], '
        b'"max_tokens": 5}' % names.MODEL.encode()
    )
    status, body, _ = await gw.post(CHAT, raw=raw)
    assert status == 200, body
    sent = ups[0].raw_requests[-1]
    assert sent.count(b'"max_tokens"') == 1 and msgspec.json.decode(sent)["max_tokens"] == 5


def test_the_error_tree_is_whole_in_errors_py_and_old_import_paths_still_work() -> None:
    from tokenplane.gateway import ConfigError as FromPackage
    from tokenplane.gateway import errors
    from tokenplane.gateway.config import ConfigError as FromConfig
    from tokenplane.gateway.transports.httptools_connection import UpstreamConnectionError
    from tokenplane.gateway.workflows import InvalidHint, WorkflowNotFound

    assert FromPackage is FromConfig is errors.ConfigError and issubclass(errors.ConfigError, ValueError)
    assert UpstreamConnectionError is errors.UpstreamConnectionError
    assert issubclass(UpstreamConnectionError, ConnectionError)
    assert InvalidHint is errors.InvalidHint and issubclass(InvalidHint, errors.InvalidParameter)
    assert WorkflowNotFound is errors.WorkflowNotFound and WorkflowNotFound.status == 404
    # From the source: a module compiled by mypyc (the compiled build) has no ``__doc__``.
    source = Path(__file__).resolve().parents[2] / "src" / "tokenplane" / "gateway" / "errors.py"
    tree = ast.get_docstring(ast.parse(source.read_text())) or ""
    for name, obj in vars(errors).items():
        if isinstance(obj, type) and issubclass(obj, Exception) and obj.__module__ == errors.__name__:
            assert name in tree, f"{name} is missing from the hierarchy in gateway/errors.py's docstring"
