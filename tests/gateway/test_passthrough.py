"""Other OpenAI routes: ``POST /v1/embeddings`` (and any ``POST /v1/*`` the pool's runtime serves)
pass through with authentication, model resolution, tenant limits, load-aware routing and
accounting; unknown routes outside ``/v1/`` stay 404 in the OpenAI error shape."""

from __future__ import annotations

import base64
import struct

import openai
import pytest

from tokenplane.emulator.server import EMBEDDING_DIMENSIONS, _embedding

pytestmark = pytest.mark.anyio


def _decoded(vector: list[float] | str) -> list[float]:
    if isinstance(vector, str):  # the openai client may ask for base64 and decode it itself
        raw = base64.b64decode(vector)
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    return vector


async def test_embeddings_pass_through_to_the_pool(emulators, emu_gateway, names) -> None:
    emus = await emulators(2)
    gw = await emu_gateway(emus)
    client = gw.client()
    for _ in range(2):
        out = await client.embeddings.create(model=names.MODEL, input=["hello", "world"])
        assert [d.index for d in out.data] == [0, 1]
        for d, text in zip(out.data, ["hello", "world"], strict=True):
            got = _decoded(d.embedding)
            want = _embedding(text, EMBEDDING_DIMENSIONS)
            assert got == pytest.approx(want, abs=1e-6)
    metrics = await gw.get("/metrics")
    # routed by the model's router over its pool (round-robin here): each instance served one
    for emu in emus:
        count = f'tokenplane_upstream_duration_seconds_count{{instance="{emu.name}"'
        assert any(m.startswith(count) and m.endswith(" 1.0") for m in metrics.splitlines()), metrics
    labels = f'model="{names.MODEL}",outcome="ok",reason="round_robin",tenant="acme"'
    line = f"tokenplane_requests_total{{{labels}}} 2.0"
    assert line in metrics.splitlines(), metrics
    instances = await gw.instances()
    assert all(v["outstanding_requests"] == 0 for v in instances.values())  # accounting released


async def test_passthrough_needs_a_key_and_a_known_model(emulators, emu_gateway, names) -> None:
    emus = await emulators(1)
    gw = await emu_gateway(emus)
    with pytest.raises(openai.AuthenticationError):
        await gw.client(key="sk-wrong").embeddings.create(model=names.MODEL, input="x")
    with pytest.raises(openai.NotFoundError):
        await gw.client().embeddings.create(model="no-such-model", input="x")
    status, body, _ = await gw.post("/v1/embeddings", raw=b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"


async def test_unknown_routes_keep_their_errors(emulators, emu_gateway, names) -> None:
    emus = await emulators(1)
    gw = await emu_gateway(emus)
    status, body, _ = await gw.post("/nope", {"model": names.MODEL})
    assert status == 404 and body["error"]["type"] == "invalid_request_error"
    status, body, _ = await gw.post("/v1/models", {"model": names.MODEL})  # a gateway route, GET only
    assert status == 405 and "error" in body
