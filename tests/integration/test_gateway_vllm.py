"""The gateway in front of two REAL vLLM CPU instances, driven with the official `openai` client.

The gateway runs in-process (``vllm_gateway`` in conftest.py: a fresh one per test, prefix-affinity
router, scrape every 0.5 s, health every 1 s); the instances are the session's shared servers. Each
test reads the instances' own Prometheus counters before and after, so what earlier tests left in
their caches and counters does not matter. The test that kills an instance is last; it restarts it
at the end.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from patience import Patience
from tiny_model import sample_text
from vllm_server import VllmEndpoint, VllmProcess, scrape_metrics

openai = pytest.importorskip("openai", reason="the openai client is needed (dev dependency)")
pytest.importorskip("prometheus_client", reason="prometheus_client is needed (dev dependency)")

pytestmark = [pytest.mark.vllm, pytest.mark.anyio]

IGNORE_EOS = {"ignore_eos": True}  # random weights: make output lengths exact
HITS = "vllm:prefix_cache_hits_total"
SUCCESS = "vllm:request_success_total"
MISS = ("ok", "prefix_miss_least_loaded")
MATCH = ("ok", "prefix_match")


async def scrape(ep: VllmEndpoint) -> dict[str, float]:
    """One instance's own /metrics, read directly (not through the gateway)."""
    return await asyncio.to_thread(scrape_metrics, ep.metrics_url)


async def scrape_all(eps: list[VllmEndpoint]) -> list[dict[str, float]]:
    return list(await asyncio.gather(*(scrape(ep) for ep in eps)))


async def eventually(pred: Callable[[], Awaitable[bool]], timeout: float = 10.0, what: str = "") -> float:
    """Poll until ``pred()``; return the seconds it took. A machine-wide freeze costs the timeout one
    poll's step (`Patience`)."""
    t0 = time.monotonic()
    patience = Patience(timeout)
    while not await pred():
        if patience.spent():
            raise AssertionError(f"not reached in {timeout} s of polling: {what}")
        await asyncio.sleep(0.1)
    return time.monotonic() - t0


async def success_deltas(eps: list[VllmEndpoint], before: list[dict[str, float]], total: int) -> list[float]:
    """Each instance's ``request_success_total`` rise, once the rises add up to ``total``."""
    deltas: list[float] = []

    async def settled() -> bool:
        nonlocal deltas
        now = await scrape_all(eps)
        deltas = [n[SUCCESS] - b[SUCCESS] for n, b in zip(now, before, strict=True)]
        return sum(deltas) >= total

    await eventually(settled, what=f"{total} successes counted by the instances")
    assert sum(deltas) == total, deltas
    return deltas


def cached_tokens(usage: Any) -> int:
    details = usage.prompt_tokens_details
    return (details.cached_tokens or 0) if details is not None else 0


# --- 1. the API -----------------------------------------------------------------------------------


async def test_stream_and_non_stream_chat_and_completions(vllm_gateway: Any) -> None:
    client = vllm_gateway.client()
    alias = vllm_gateway.alias

    models = [m.id async for m in client.models.list()]
    assert "tiny" in models or alias in models, models

    stream = await client.chat.completions.create(
        model=alias,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=IGNORE_EOS,
    )
    text, finish, usage, content_chunks = "", None, None, 0
    async for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta.content or ""
            text += delta
            content_chunks += bool(delta)
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            assert not chunk.choices  # the usage chunk comes last, on its own
            usage = chunk.usage
    assert finish == "length" and content_chunks > 1 and text
    assert usage is not None and usage.completion_tokens == 24 and usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + 24

    cstream = await client.completions.create(
        model=alias,
        prompt="The question is",
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=IGNORE_EOS,
    )
    chunks = [c async for c in cstream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 20
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert "".join(c.choices[0].text for c in chunks if c.choices)

    chat = await client.chat.completions.create(
        model=alias,
        messages=[{"role": "user", "content": "Once more."}],
        max_tokens=8,
        extra_body=IGNORE_EOS,
    )
    assert chat.choices[0].message.content and chat.choices[0].finish_reason == "length"
    assert chat.usage is not None and chat.usage.completion_tokens == 8

    comp = await client.completions.create(model=alias, prompt="Hello", max_tokens=8, extra_body=IGNORE_EOS)
    assert comp.choices[0].text and comp.usage is not None and comp.usage.completion_tokens == 8

    reasons = await vllm_gateway.requests_by_reason()
    assert sum(v for (outcome, _), v in reasons.items() if outcome == "ok") == 4, reasons


# --- 2. prefix affinity -----------------------------------------------------------------------------


async def test_repeated_prefix_lands_on_one_instance_and_hits_its_cache(vllm_gateway: Any) -> None:
    eps = vllm_gateway.endpoints
    client = vllm_gateway.client()
    system = sample_text(300, seed=31_337)  # about 600 tokens, fresh: nothing of it is cached yet
    before = await scrape_all(eps)

    usages = []
    for i in range(4):  # sequential: nothing in flight, so only the prefix index decides
        resp = await client.chat.completions.create(
            model=vllm_gateway.alias,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": f"Question {i}?"}],
            max_tokens=4,
            temperature=0,
            extra_body=IGNORE_EOS,
        )
        assert resp.usage is not None
        usages.append(resp.usage)
    assert usages[0].prompt_tokens >= 4 * 128, usages[0]  # several vLLM CPU blocks of 128 tokens
    assert cached_tokens(usages[0]) == 0
    later = [cached_tokens(u) for u in usages[1:]]
    assert all(c >= 3 * 128 and c % 128 == 0 for c in later), later  # whole blocks, from the cache

    deltas = await success_deltas(eps, before, 4)
    target = deltas.index(4)  # all four on one instance
    other = 1 - target
    assert deltas[other] == 0, deltas

    async def target_hits_rose() -> bool:
        return (await scrape(eps[target]))[HITS] >= before[target][HITS] + sum(later)

    await eventually(target_hits_rose, what="the chosen instance's prefix_cache_hits_total rising")
    assert (await scrape(eps[other]))[HITS] == before[other][HITS]

    reasons = await vllm_gateway.requests_by_reason()
    assert reasons.get(MISS) == 1 and reasons.get(MATCH) == 3, reasons

    # The gateway's scraped view of the counters agrees.
    tid = vllm_gateway.ids[target]

    async def gateway_saw_hits() -> bool:
        return (await vllm_gateway.instances())[tid]["prefix_cache_hits"] >= before[target][HITS] + sum(later)

    await eventually(gateway_saw_hits, what="the gateway's scrape showing the hits")


# --- 3. unrelated load spreads ----------------------------------------------------------------------


async def test_unrelated_concurrent_requests_spread_over_both_instances(vllm_gateway: Any) -> None:
    eps = vllm_gateway.endpoints
    client = vllm_gateway.client()
    before = await scrape_all(eps)
    prompts = [sample_text(8, seed=5_000 + i) for i in range(8)]

    results = await asyncio.gather(
        *(
            client.completions.create(
                model=vllm_gateway.alias, prompt=p, max_tokens=32, temperature=0, extra_body=IGNORE_EOS
            )
            for p in prompts
        )
    )
    assert all(r.usage is not None and r.usage.completion_tokens == 32 for r in results)

    deltas = await success_deltas(eps, before, 8)
    assert min(deltas) >= 2, deltas  # least-loaded by the gateway's own in-flight count: about 4 + 4
    reasons = await vllm_gateway.requests_by_reason()
    assert reasons == {MISS: 8}, reasons


# --- 4. the gateway's view of the instances ---------------------------------------------------------


POLL_LIMIT_S = 90.0  # on 2 busy cores this process can stall for many seconds between two polls
STREAMS_START_S = 60.0  # the streams' first tokens, before the burst is sent
RUNTIME_GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
}


class RuntimeWatch:
    """What each instance's own ``/metrics`` says while the burst runs, read from a thread per
    instance: not through the gateway, and not on this process's event loop (which also runs the
    gateway). A failure then says whether the runtime showed the load and the gateway's view missed
    it, or the runtime never showed it."""

    def __init__(self, eps: list[VllmEndpoint], ids: list[str]) -> None:
        self.peak = {i: dict.fromkeys(RUNTIME_GAUGES.values(), 0.0) for i in ids}
        self.reads = dict.fromkeys(ids, 0)
        self.errors: dict[str, list[str]] = {i: [] for i in ids}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._watch, args=(i, ep.metrics_url), daemon=True)
            for i, ep in zip(ids, eps, strict=True)
        ]

    def _watch(self, iid: str, url: str) -> None:
        while not self._stop.is_set():
            try:
                m = scrape_metrics(url, timeout=30.0)
            except OSError as exc:
                self.errors[iid].append(f"{type(exc).__name__}: {exc}")
            else:
                self.reads[iid] += 1
                for name, field in RUNTIME_GAUGES.items():
                    self.peak[iid][field] = max(self.peak[iid][field], m.get(name, 0.0))
            self._stop.wait(0.25)

    def __enter__(self) -> RuntimeWatch:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=35.0)

    def __str__(self) -> str:
        errors = {i: (len(e), e[-1:]) for i, e in self.errors.items() if e}
        return f"the runtimes' own /metrics: peak {self.peak}, reads {self.reads}, errors {errors}"


async def test_gateway_view_of_running_waiting_and_kv_under_a_burst(vllm_gateway: Any) -> None:
    """2 long streams, then 38 long plain requests at once: 20 an instance, over `--max-num-seqs 16`,
    so some wait in vLLM's queue. The streams go first and the burst follows their first tokens, so
    they run rather than wait behind it (sent together, vLLM's API server may hand the plain ones to
    its engine first, and then no chunk comes before the first wave ends: about 70 s on a busy
    machine). The client leaves once the gateway has shown the load (the client and the gateway share
    this process, and on a small machine its loop can stall for seconds, so a burst of fixed length
    could end between two polls); leaving aborts the requests in vLLM."""
    client = vllm_gateway.client(timeout=300.0)  # the requests outlive the poll; never the client's timeout
    eps, ids = vllm_gateway.endpoints, vllm_gateway.ids
    # The KV cache's size as vLLM publishes it (vllm:cache_config_info), not from the gateway's config.
    for _ in range(50):  # the first scrape may still be on its way
        sizes = {i: v["kv_capacity_tokens"] for i, v in (await vllm_gateway.instances()).items()}
        if all(n > 0 for n in sizes.values()):
            break
        await asyncio.sleep(0.1)
    assert all(n > 0 for n in sizes.values()), sizes
    # Few streams: parsing thousands of chunks in this process would starve the gateway it also hosts.
    # 3,800 tokens x 2 waves: about 40 s of work on an idle machine (the tiny model decodes 16 sequences
    # at ~2,700 tokens/s), longer than this process stalls when the machine is busy.
    n_streams, n_plain, max_tokens = 2, 38, 3800
    peak: dict[str, dict[str, float]] = {
        i: {"running": 0, "waiting": 0, "kv_usage": 0.0, "outstanding_requests": 0} for i in ids
    }
    history: list[tuple[float, str, float, int, int, float, int]] = []  # for a failure's message
    last_view: dict[str, dict[str, Any]] = {}
    chunks = [0] * n_streams
    started = [asyncio.Event() for _ in range(n_streams)]
    t0 = time.monotonic()

    async def stream(i: int) -> None:
        s = await client.completions.create(
            model=vllm_gateway.alias,
            prompt=sample_text(12, seed=9_000 + i),
            max_tokens=max_tokens,
            stream=True,
            extra_body=IGNORE_EOS,
        )
        async for _ in s:
            chunks[i] += 1
            started[i].set()

    async def plain(i: int) -> None:
        await client.completions.create(
            model=vllm_gateway.alias,
            prompt=sample_text(12, seed=9_500 + i),
            max_tokens=max_tokens,
            extra_body=IGNORE_EOS,
        )

    def seen_enough() -> bool:
        return all(
            p["outstanding_requests"] >= 16 and p["running"] >= 1 and p["kv_usage"] > 0.0
            for p in peak.values()
        ) and any(p["waiting"] >= 1 for p in peak.values())

    async def poll() -> None:
        for iid, d in (await vllm_gateway.instances()).items():
            assert d["waiting"] >= 0 and d["running"] >= 0 and 0.0 <= d["kv_usage"] <= 1.0, d
            last_view[iid] = d
            for k in peak[iid]:
                peak[iid][k] = max(peak[iid][k], d[k])
            age = time.time() - d["scraped_at"]
            history.append(
                (round(time.monotonic() - t0, 2), iid, round(age, 2), d["running"], d["waiting"],
                 d["kv_usage"], d["outstanding_requests"])
            )  # fmt: skip

    # Streams first, one an instance (least-loaded); then the burst, which least-loaded splits 19 and 19.
    tasks = [asyncio.create_task(stream(i)) for i in range(n_streams)]
    with RuntimeWatch(eps, ids) as runtime:
        try:
            patience = Patience(STREAMS_START_S)
            while not all(e.is_set() for e in started) and not patience.spent():
                await asyncio.sleep(0.1)
            assert all(e.is_set() for e in started), f"no first token within {STREAMS_START_S:g} s: {chunks}"
            tasks += [asyncio.create_task(plain(i)) for i in range(n_plain)]
            patience = Patience(POLL_LIMIT_S)  # a machine-wide freeze costs it one step
            while not seen_enough() and not patience.spent():
                await poll()
                await asyncio.sleep(0.1)
        finally:
            for t in tasks:
                t.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
    ages = [h[2] for h in history]
    scrapes = {
        i: {k: v.get(k) for k in ("healthy", "scrape_failures", "consecutive_failures", "last_error")}
        for i, v in last_view.items()
    }
    outcomes = Counter(type(r).__name__ if r is not None else "done" for r in results)
    outcomes.update(f"{type(r).__name__}: {r}"[:200] for r in results if isinstance(r, Exception))
    why = (
        f"after {time.monotonic() - t0:.1f} s, {len(history)} polls, "
        f"scrape age max {max(ages, default=0):.1f} s; peak {peak}; chunks {chunks}; {runtime}; "
        f"the gateway's scrapes: {scrapes}; outcomes {outcomes}; "
        f"last (t, id, scrape age, running, waiting, kv, in flight): {history[-4:]}"
    )
    # One condition an assert, so that a failure's last lines say which one was never seen.
    lowest = {k: min(p[k] for p in peak.values()) for k in ("outstanding_requests", "running", "kv_usage")}
    assert lowest["outstanding_requests"] >= 16, why
    assert lowest["running"] >= 1, why
    assert lowest["kv_usage"] > 0.0, why
    assert max(p["waiting"] for p in peak.values()) >= 1, why
    # Cancelled, or (when this process was starved of CPU for seconds) finished: never failed.
    assert all(r is None or isinstance(r, asyncio.CancelledError) for r in results), f"{results} {why}"
    # Least-loaded: the burst splits 20 and 20. A request that finished before the first poll (this
    # process starved for seconds while vLLM decoded) is missing from its instance's peak.
    finished = sum(1 for r in results if r is None)
    for iid in ids:
        assert 20 - finished <= peak[iid]["outstanding_requests"] <= 20, f"{finished} finished; {why}"
        assert peak[iid]["running"] <= 16, why  # --max-num-seqs

    # The client left: the gateway's accounting, and the instances themselves (the requests were
    # aborted, not finished: that would take tens of seconds), drop back to idle.
    async def drained() -> bool:
        view = await vllm_gateway.instances()
        direct = await scrape_all(eps)
        return all(
            view[i]["running"] == 0
            and view[i]["waiting"] == 0
            and view[i]["kv_usage"] < peak[i]["kv_usage"]
            and view[i]["outstanding_requests"] == 0
            for i in ids
        ) and all(m["vllm:num_requests_running"] + m["vllm:num_requests_waiting"] == 0 for m in direct)

    await eventually(drained, timeout=10.0, what="the gateway's view dropping back after the burst")


# --- 5. (last) an instance dies --------------------------------------------------------------------


async def test_killed_instance_is_taken_out_and_traffic_goes_to_the_other(
    vllm_gateway: Any, vllm_instances: list[VllmProcess]
) -> None:
    eps = vllm_gateway.endpoints
    client = vllm_gateway.client()
    alias = vllm_gateway.alias
    system = sample_text(200, seed=77_001)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Go on."}]

    # Pin a prefix to one instance, then kill that one (nothing in flight).
    before = await scrape_all(eps)
    await client.chat.completions.create(model=alias, messages=messages, max_tokens=4, extra_body=IGNORE_EOS)
    deltas = await success_deltas(eps, before, 1)
    victim = deltas.index(1)
    survivor = 1 - victim
    vid, sid = vllm_gateway.ids[victim], vllm_gateway.ids[survivor]
    assert (await vllm_gateway.instances())[vid]["healthy"]

    vllm_instances[victim].kill()
    t_kill = time.monotonic()

    async def taken_out() -> bool:
        return not (await vllm_gateway.instances())[vid]["healthy"]

    await eventually(taken_out, timeout=8.0, what=f"{vid} marked down after SIGKILL")
    took = time.monotonic() - t_kill
    assert took <= 5.0, took  # health every 1 s, two failures to go down
    view = await vllm_gateway.instances()
    assert view[sid]["healthy"] and view[vid]["last_error"]
    health = await vllm_gateway.health()
    assert health["healthy_instances"] == 1 and health["instances"] == 2, health

    # Everything now succeeds on the survivor, the pinned prefix included.
    before_s = await scrape(eps[survivor])
    reasons_before = await vllm_gateway.requests_by_reason()

    async def chat_stream(i: int) -> int:
        stream = await client.chat.completions.create(
            model=alias,
            messages=messages if i == 0 else [{"role": "user", "content": sample_text(10, seed=i)}],
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=IGNORE_EOS,
        )
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        assert usage is not None
        return int(usage.completion_tokens)

    async def completion(i: int) -> int:
        resp = await client.completions.create(
            model=alias, prompt=sample_text(10, seed=100 + i), max_tokens=16, extra_body=IGNORE_EOS
        )
        assert resp.usage is not None
        return int(resp.usage.completion_tokens)

    got = await asyncio.gather(*(chat_stream(i) for i in range(3)), *(completion(i) for i in range(3)))
    assert got == [16] * 6

    async def survivor_served_all() -> bool:
        return (await scrape(eps[survivor]))[SUCCESS] - before_s[SUCCESS] >= 6

    await eventually(survivor_served_all, what="the survivor serving all six")
    reasons = await vllm_gateway.requests_by_reason()
    new = {k: v - reasons_before.get(k, 0.0) for k, v in reasons.items()}
    assert sum(v for (outcome, _), v in new.items() if outcome == "ok") == 6, new
    assert sum(v for (outcome, _), v in new.items() if outcome != "ok") == 0, new
    assert not vllm_instances[victim].alive()

    # Restarted (same port, empty cache), it is brought back and gets traffic again. This restart
    # stands in for the one the autouse fixture would do before the next test that needs both.
    await asyncio.to_thread(vllm_instances[victim].restart)
    t_up = time.monotonic()

    async def back() -> bool:
        return bool((await vllm_gateway.instances())[vid]["healthy"])

    await eventually(back, timeout=5.0, what=f"{vid} brought back after restart")
    assert time.monotonic() - t_up <= 3.0  # one good probe, every 1 s
    before = await scrape_all(eps)
    got = await asyncio.gather(*(completion(200 + i) for i in range(4)))
    assert got == [16] * 4
    deltas = await success_deltas(eps, before, 4)
    assert deltas[victim] >= 1, deltas
