"""Circuit breakers and the retry budget at the gateway, with emulated and fake instances."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.anyio

MODEL = "llama-3-8b"
PROMPT = "hello there, general kenobi"


async def _samples(gw, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for fam in text_string_to_metric_families(await gw.get("/metrics")):
        for s in fam.samples:
            if s.name == name:
                out.append((s.labels, s.value))
    return out


async def test_500s_open_the_breaker_traffic_moves_and_a_probe_closes_it(
    emulators, emu_gateway, wait
) -> None:
    emus = await emulators(3)
    # The cooldown must outlast the 18 requests sent while the breaker is expected open, on a busy
    # machine too (0.5 s did not, once: the breaker was already half-open when checked).
    gw = await emu_gateway(emus, breaker={"consecutive_failures": 3, "cooldown_s": 3.0})
    await emus[0].faults(error_status=500)  # every request, until cleared
    client = gw.client()
    for _ in range(12):  # round-robin: every third first attempt lands on emu-0, then is retried
        r = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
        assert len(r.choices[0].text.split()) == 4
    inst = await gw.instances()
    assert inst["emu-0"]["breaker"] == "open"
    opened = await _samples(gw, "tokenplane_breaker_transitions_total")
    assert (
        {"instance": "emu-0", "from_state": "closed", "to_state": "open", "reason": "consecutive_failures"},
        1.0,
    ) in opened
    states = {lab["instance"]: v for lab, v in await _samples(gw, "tokenplane_breaker_state")}
    assert states == {"emu-0": 2.0, "emu-1": 0.0, "emu-2": 0.0}
    before = [await e.success_total() for e in emus]
    for _ in range(6):  # the breaker is open: nothing reaches emu-0
        await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
    after = [await e.success_total() for e in emus]
    assert after[0] == before[0] and sum(after) - sum(before) == 6

    await emus[0].faults(clear=True)

    async def half_open() -> bool:
        return (await gw.instances())["emu-0"]["breaker"] == "half_open"

    await wait(half_open, timeout_s=10.0)
    for _ in range(3):  # one of these is the probe
        await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
    assert (await gw.instances())["emu-0"]["breaker"] == "closed"
    assert await emus[0].success_total() >= 1
    reasons = {lab["reason"] for lab, _ in await _samples(gw, "tokenplane_breaker_transitions_total")}
    assert {"consecutive_failures", "cooldown_elapsed", "probe_succeeded"} <= reasons


async def test_every_instance_failing_budget_bounds_attempts_and_503s_are_fast(
    upstreams, gateway, names
) -> None:
    ups = await upstreams(3)
    for u in ups:
        u.mode = "fail"
    ratio, floor_per_s, window_s = 0.2, 0.1, 10.0
    gw = await gateway(
        ups,
        router="round-robin",
        health={"interval_s": 60, "failures_to_down": 1000},
        retry={"budget_ratio": ratio, "min_per_s": floor_per_s, "window_s": window_s, "max_attempts": 3},
        breaker={"consecutive_failures": 3, "cooldown_s": 30},
    )
    n = 60
    statuses: list[int] = []
    durations: list[float] = []
    for _ in range(n):
        t0 = time.monotonic()
        status, err, headers = await gw.post("/v1/completions", {"model": names.MODEL, "prompt": "x"})
        durations.append(time.monotonic() - t0)
        statuses.append(status)
        if status == 503:
            assert err["error"]["code"] == "no_healthy_instance" and int(headers["Retry-After"]) >= 1
    attempts = sum(len(u.requests) for u in ups)
    slowest = max(d for d, s in zip(durations, statuses, strict=True) if s == 503)
    print(
        f"\nall failing: {attempts} attempts / {n} requests = {attempts / n:.2f}; slowest 503 {slowest:.4f} s"
    )
    # retries <= ratio x first attempts + floor: attempts / requests <= 1 + ratio + floor / requests
    assert attempts <= n * (1 + ratio) + floor_per_s * window_s
    assert attempts / n <= 1 + ratio + floor_per_s * window_s / n
    assert statuses.count(503) >= n - 10  # once every breaker is open, refusals are immediate
    fast = [d for d, s in zip(durations, statuses, strict=True) if s == 503]
    assert max(fast) < 0.5
    balance = await _samples(gw, "tokenplane_retry_budget_balance")
    assert balance and balance[0][1] <= floor_per_s * window_s + ratio * n

    # Concurrent callers too: fast 503s, not queueing.
    t0 = time.monotonic()
    results = await asyncio.gather(
        *(gw.post("/v1/completions", {"model": names.MODEL, "prompt": "x"}) for _ in range(50))
    )
    assert {r[0] for r in results} == {503}
    assert time.monotonic() - t0 < 0.5
    assert sum(len(u.requests) for u in ups) == attempts


async def test_clients_leaving_before_the_answer_do_not_open_a_breaker(emulators, emu_gateway) -> None:
    """A slow-to-answer instance whose callers give up is not a failing instance."""
    emus = await emulators(1)
    gw = await emu_gateway(emus, breaker={"consecutive_failures": 2, "cooldown_s": 5})
    await emus[0].faults(hang=True, hang_count=6)
    client = gw.client()
    for _ in range(6):  # each client gives up before the hung instance answers
        with pytest.raises(openai.APITimeoutError):
            await client.with_options(timeout=0.3).completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=4
            )
    await asyncio.sleep(0.2)
    assert (await gw.instances())["emu-0"]["breaker"] == "closed"
    r = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
    assert len(r.choices[0].text.split()) == 4
