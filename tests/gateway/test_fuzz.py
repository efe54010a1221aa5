"""Random JSON bodies, valid-looking or not, never make the gateway answer 5xx."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.anyio

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"]) | _json},
    optional={"content": st.text(max_size=40) | _json},
)
_params = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["llama-3-8b", "gpt-4o-mini", "nope"]) | _json,
        "messages": st.lists(_message, max_size=3) | _json,
        "prompt": st.text(max_size=40) | st.lists(st.integers(0, 1000), max_size=5) | _json,
        "max_tokens": st.integers(-5, 10_000) | _json,
        "stream": st.booleans() | _json,
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | _json})
        | _json,
        "temperature": st.floats(-1, 3, allow_nan=False) | _json,
        "n": st.integers(-1, 3) | _json,
        "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=2) | _json,
        "top_k": _json,
    },
)
_bodies = _params.map(msgspec.json.encode) | _json.map(msgspec.json.encode) | st.binary(max_size=64)


@pytest.fixture
async def running(upstreams, gateway):
    ups = await upstreams(2)
    return await gateway(ups)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_bodies, path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
async def test_random_bodies_never_5xx(running, body: bytes, path: str) -> None:
    status, answer, _ = await running.post(path, None, raw=body)
    assert status < 500, (status, answer)
    if status != 200:
        assert set(answer["error"]) == {"message", "type", "code", "param"}
