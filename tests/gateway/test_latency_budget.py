"""The tenant's latency budget is a time-to-first-token budget: it bounds a stream's wait for its
first byte and the retries of any request, but it neither cuts a plain answer that takes longer to
generate nor makes a busy instance look broken."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
BUDGET = {"queue": {"budget_s": {"interactive": 0.2}}}
BREAKER = {"consecutive_failures": 2, "cooldown_s": 30}


def _m(**kw):
    return {"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **kw}


async def test_a_plain_answer_longer_than_the_budget_is_delivered(upstreams, gateway) -> None:
    """vLLM sends a plain answer's headers with its last token: a generation longer than the budget
    is the answer, not a timeout."""
    ups = await upstreams(1)
    ups[0].answer_delay_s = 0.5
    gw = await gateway(ups, admission=BUDGET, breaker=BREAKER, health={"interval_s": 60})
    for _ in range(3):
        status, body, _ = await gw.post(CHAT, _m())
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == "tok " * 4
    view = (await gw.instances())["up-0"]
    assert view["healthy"] and view["consecutive_failures"] == 0 and view["breaker"] == "closed"


async def test_a_stream_past_its_budget_is_a_miss_not_an_instance_fault(upstreams, gateway) -> None:
    """No first byte within the budget: 504 ``deadline_exceeded``; the instance stays in, its breaker
    closed, and the next caller with time to wait is served by it."""
    ups = await upstreams(1)
    ups[0].answer_delay_s = 0.5
    gw = await gateway(ups, admission=BUDGET, breaker=BREAKER, health={"interval_s": 60})
    for _ in range(3):  # more misses than the breaker's and the health check's failure limits
        status, err, _ = await gw.post(CHAT, _m(stream=True))
        assert status == 504, err
        assert err["error"]["code"] == "deadline_exceeded" and err["error"]["type"] == "upstream_error"
        assert "latency budget" in err["error"]["message"]
    view = (await gw.instances())["up-0"]
    assert view["healthy"] and view["consecutive_failures"] == 0 and view["breaker"] == "closed"
    ups[0].answer_delay_s = 0.0
    status, raw, _ = await gw.post(CHAT, _m(stream=True))
    assert status == 200 and b"[DONE]" in raw


async def test_the_operators_first_byte_limit_still_judges_the_instance(upstreams, gateway) -> None:
    """``retry.first_byte_timeout_s`` is the operator's word on how long an instance may stay silent:
    hitting it is the instance's failure, for plain answers too."""
    ups = await upstreams(1)
    ups[0].answer_delay_s = 0.5
    gw = await gateway(ups, breaker=BREAKER, health={"interval_s": 60}, retry={"first_byte_timeout_s": 0.1})
    status, err, _ = await gw.post(CHAT, _m())
    assert status == 504 and err["error"]["code"] == "upstream_timeout", err
    assert (await gw.instances())["up-0"]["consecutive_failures"] == 1
