"""Exact prefix routing vs the approximate index, on an emulated fleet replaying multi-turn chats.

Four emulators (``tokenplane emulate`` in-process) tokenize with the same tokenizer folder as the
gateway and publish their prefix caches as vLLM's KV events; their KV caches are small enough that
conversations get evicted. The same workload (``--conversations`` conversations over
``--systems`` shared system prompts, ``--turns`` turns each, ``--concurrency`` at once; user turns
and reply lengths drawn from ``--seed``) is replayed through the gateway (prefix-affinity) twice:

* ``approximate``: no tokenizer; the character-block index decides;
* ``exact``: ``models[].tokenizer`` set; chat prompts are tokenized and matched against the events.

``--replicas N`` runs N gateway replicas, each with its own approximate index (memory state), and
spreads each conversation's turns over them as a load balancer would; every replica subscribes to
every emulator's events (the emulators bind, the replicas connect). ``--state redis`` gives them the
Redis backend at ``--redis-url`` (a fresh key prefix per run): shared limits, prefix index and, with
``--share-in-flight on``, each instance's in-flight work (``state.share_in_flight``), so the queue
discount sees the fleet's queue; ``--share-in-flight both`` runs exact mode without and with it.

Printed per mode: the engines' own prefix-hit ratio (``vllm:prefix_cache_hits_total`` over
``vllm:prefix_cache_queries_total``, summed over the fleet) and, in exact mode, the gateway's
predicted hit ratio (the cached tokens it matched on the instance it chose, capped as vLLM caps a
hit: the last prompt token is always computed, so at most ``(prompt - 1) // 16`` blocks) and of
those the ones expected to survive the instance's queue (``core.routing.kv_survival``, what the
router decides on; ``gateway_matched_hit_ratio``: all of them, as the events reported them).
``--queue-discount off`` routes on the reported match and predicts it (the behaviour before the
discount); ``--queue-discount both`` runs exact mode both ways, side by side in one run.

``--explain`` (exact mode) says where the two part, request by request (a decision paired with
the request that reaches the instance by instance and prompt length), in shares of the prompt
tokens: ``index_vs_arrival``, the prediction minus what the engine's cache held of the prompt
when the request reached it (the index lagging the events, and blocks evicted while the request
travelled: an emulated step is 1 ms of wall time at ``--speed 20``, shorter than the hop, where a
GPU step is tens of ms); ``evicted_while_queued`` / ``evicted_at_admission``, blocks evicted between
its arrival and its admission, net of blocks a request ahead cached meanwhile (negative when those
are more), for requests that found other requests waiting / none (vLLM's LRU
evicts a waiting request's unreferenced prefix blocks for the running ones: nothing the events can
foresee). ``--kv-tokens`` sets each emulator's KV cache (5000 gives evictions and queues).

    python tests/support/tiny_tokenizer.py /tmp/tok-tiny
    python bench/exact_prefix_routing.py --tokenizer /tmp/tok-tiny --json
    python bench/exact_prefix_routing.py --tokenizer /tmp/tok-tiny --seed 2
    python bench/exact_prefix_routing.py --tokenizer /tmp/tok-tiny --replicas 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import sys
import uuid
from collections import deque
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

MODEL = "chat"
KEY = "sk-exact-prefix-bench"
BLOCK = 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Explain:
    """``--explain``: each exact decision's prediction, the engine's cache when the request arrives,
    and the hit it finds when admitted (first admission), on the in-process emulators."""

    def __init__(self) -> None:
        self.decided: dict[tuple[str, int], deque[int]] = {}
        self.arrived: dict[tuple[str, int], tuple[int, int, bool]] = {}
        self.totals = dict.fromkeys(("prompt", "predicted", "arrival", "admitted", "lost_queued"), 0)

    def decision(self, instance_id: str, prompt: int, predicted: int) -> None:
        self.decided.setdefault((instance_id, prompt), deque()).append(predicted)

    def attach(self, inst: Any) -> None:
        engine, submit, on_admit = inst.engine, inst.submit, inst.engine.on_admit

        def arrive(request_id: str, prompt: int, hashes: tuple[int, ...], *a: Any, **k: Any) -> Any:
            held = engine.kv.match(hashes, (prompt - 1) // BLOCK) * BLOCK
            queued = bool(engine.waiting)
            pending = submit(request_id, prompt, hashes, *a, **k)
            waiting = self.decided.get((engine.id, prompt))
            if waiting and pending.seq is not None:
                self.arrived[(engine.id, pending.seq.uid)] = (waiting.popleft(), held, queued)
            return pending

        def admit(seq: Any) -> None:
            row = self.arrived.pop((engine.id, seq.uid), None)
            if row is not None and not seq.record.preemptions:
                t = self.totals
                t["prompt"] += seq.spec.prompt_tokens
                t["predicted"] += row[0]
                t["arrival"] += row[1]
                t["admitted"] += seq.computed
                if row[2]:
                    t["lost_queued"] += row[1] - seq.computed
            on_admit(seq)

        inst.submit = arrive
        engine.on_admit = admit

    def report(self) -> dict[str, float]:
        t = self.totals
        p = t["prompt"] or 1
        lost = t["arrival"] - t["admitted"]
        return {
            "paired_prompt_tokens": t["prompt"],
            "predicted": t["predicted"] / p,
            "index_vs_arrival": (t["predicted"] - t["arrival"]) / p,
            "evicted_while_queued": t["lost_queued"] / p,
            "evicted_at_admission": (lost - t["lost_queued"]) / p,
            "admitted": t["admitted"] / p,
        }


class Recorder:
    """Wraps the model's router: what the gateway predicted for each routed request."""

    def __init__(self, inner: Any, explain: Explain | None = None, discount: bool = True) -> None:
        self.inner = inner
        self.explain = explain
        self.discount = discount
        self.matched = 0
        self.predicted = 0
        self.prompt = 0
        self.reasons: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def select(self, request: Any, candidates: Any, *, now: float) -> Any:
        d = self.inner.select(request, candidates, now=now)
        self.reasons[d.reason.value] = self.reasons.get(d.reason.value, 0) + 1
        exact = request.cached_prefix_tokens
        if exact is not None and d.instance_id is not None:
            from tokenplane.core.routing.kv_survival import surviving_prefix_tokens

            cap = (request.prompt_tokens - 1) // BLOCK * BLOCK
            matched = predicted = min(exact.get(d.instance_id, 0), cap)
            if self.discount:
                view = next(v for v in candidates if v.instance_id == d.instance_id)
                predicted = surviving_prefix_tokens(matched, request, view)
            self.matched += matched
            self.predicted += predicted
            self.prompt += request.prompt_tokens
            if self.explain is not None:
                self.explain.decision(d.instance_id, request.prompt_tokens, predicted)
        return d


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def workload(seed: int, conversations: int, systems: int, turns: int) -> list[list[tuple[str, int]]]:
    """Per conversation: (user text, reply tokens) per turn; conversation k uses system k % systems."""
    from tiny_model import sample_text

    rng = random.Random(seed)
    return [
        [
            (sample_text(rng.randint(20, 120), seed=rng.randrange(1 << 30)), rng.randint(16, 128))
            for _ in range(turns)
        ]
        for _ in range(conversations)
    ]


async def run(
    mode: str, a: argparse.Namespace, discount: bool = True, share_in_flight: bool = True
) -> dict[str, Any]:
    import aiohttp
    import openai
    from tiny_model import sample_text

    from tokenplane.emulator import EmulatorSettings, instance_of, start_emulator
    from tokenplane.gateway import create_app, hash_key, parse_config
    from tokenplane.gateway.app import GATEWAY_KEY
    from tokenplane.gateway.server import GatewayServer

    ports = [_free_port() for _ in range(a.instances)]
    # the emulators bind (as vLLM given tcp://*:PORT) and every gateway replica connects
    endpoints = [f"tcp://*:{p}" for p in ports]
    router = {"name": "prefix-affinity", "params": {"queue_discount": discount}}
    model: dict[str, Any] = {"name": MODEL, "router": router, "upstream_model": "emu"}
    if mode == "exact":
        model["tokenizer"] = {"path": str(a.tokenizer)}
    runners, urls = [], []
    explain = Explain() if a.explain and mode == "exact" else None
    for i, ep in enumerate(endpoints):
        s = EmulatorSettings(
            served_model_name="emu", speed=a.speed, fixed_step_s=0.02, kv_capacity_tokens=a.kv_tokens,
            max_num_seqs=32, instance_id=f"emu-{i}", tokenizer=str(a.tokenizer), kv_events_endpoint=ep,
            seed=a.seed,
        )  # fmt: skip
        runner, url = await start_emulator(s)
        if explain is not None:
            explain.attach(instance_of(runner.app))
        runners.append(runner)
        urls.append(url)
    raw: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "tenants": [{"name": "bench", "api_keys": [hash_key(KEY)], "max_concurrency": 1024}],
        "models": [model],
        "instances": [
            {
                "id": f"emu-{i}",
                "url": u,
                "model": MODEL,
                "kind": "vllm",
                "kv_events": {"endpoint": f"tcp://127.0.0.1:{ports[i]}", "connect": True},
            }
            for i, u in enumerate(urls)
        ],
        "scrape": {"interval_s": a.scrape_s},
        "health": {"interval_s": 1.0},
    }
    if a.state == "redis":
        raw["state"] = {
            "backend": "redis",
            "url": a.redis_url,
            "key_prefix": f"bench-exact-{uuid.uuid4().hex[:8]}:",
            "share_in_flight": share_in_flight,
            "sync_interval_s": a.sync_s,
        }
    servers, recorders, clients = [], [], []
    for _ in range(a.replicas):  # each with its own approximate index (memory state)
        app = create_app(parse_config(raw))
        server = GatewayServer(app, "127.0.0.1", 0)
        await server.start()
        served = next(m for m in app[GATEWAY_KEY].catalog.models if m.name == MODEL)
        recorder = Recorder(served.router, explain, discount)
        served.router = recorder
        servers.append(server)
        recorders.append(recorder)
        url = str(server.make_url("/v1"))
        clients.append(openai.AsyncOpenAI(base_url=url, api_key=KEY, max_retries=2, timeout=120))
    systems = [sample_text(a.system_words, seed=900 + k) for k in range(a.systems)]
    convs = workload(a.seed, a.conversations, a.systems, a.turns)
    gate = asyncio.Semaphore(a.concurrency)
    errors = 0

    async def converse(k: int, turns: list[tuple[str, int]]) -> None:
        nonlocal errors
        messages: list[dict[str, str]] = [{"role": "system", "content": systems[k % a.systems]}]
        async with gate:
            for t, (user, reply_tokens) in enumerate(turns):
                messages.append({"role": "user", "content": user})
                client = clients[(k + t) % len(clients)]  # a load balancer spreads the turns
                try:
                    out = await client.chat.completions.create(
                        model=MODEL, messages=messages, max_tokens=reply_tokens,  # type: ignore[arg-type]
                        extra_body={"ignore_eos": True},
                    )  # fmt: skip
                except openai.APIError:
                    errors += 1
                    return
                messages.append({"role": "assistant", "content": out.choices[0].message.content or ""})
                await asyncio.sleep(a.think_s)  # the user reads; the events arrive meanwhile

    try:
        await asyncio.gather(*(converse(k, t) for k, t in enumerate(convs)))
        hits = queries = 0.0
        async with aiohttp.ClientSession() as http:
            for u in urls:
                async with http.get(u + "/metrics") as r:
                    text = await r.text()
                hits += _metric(text, "vllm:prefix_cache_hits_total")
                queries += _metric(text, "vllm:prefix_cache_queries_total")
    finally:
        for c in clients:
            await c.close()
        for srv in servers:
            await srv.close()
        for r in runners:
            await r.cleanup()
    reasons: dict[str, int] = {}
    for rec in recorders:
        for reason, n in rec.reasons.items():
            reasons[reason] = reasons.get(reason, 0) + n
    out: dict[str, Any] = {
        "mode": mode
        if mode == "approximate"
        else f"exact, queue discount {'on' if discount else 'off'}"
        + (f", in-flight shared {'on' if share_in_flight else 'off'}" if a.state == "redis" else ""),
        "requests": sum(reasons.values()),
        "errors": errors,
        "engine_hit_ratio": hits / queries if queries else 0.0,
        "reasons": reasons,
    }
    prompt = sum(rec.prompt for rec in recorders)
    if prompt:
        out["gateway_predicted_hit_ratio"] = sum(rec.predicted for rec in recorders) / prompt
        out["gateway_matched_hit_ratio"] = sum(rec.matched for rec in recorders) / prompt
    if explain is not None:
        out["explain"] = explain.report()
    return out


def _relative(r: dict[str, Any]) -> float:
    """The gateway's predicted hit ratio over the engines' own, less 1."""
    engine = r["engine_hit_ratio"]
    return r.get("gateway_predicted_hit_ratio", 0.0) / engine - 1 if engine else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--tokenizer", type=Path, required=True, help="a tokenizer folder (tests/support/tiny_tokenizer.py)"
    )
    p.add_argument("--instances", type=int, default=4)
    p.add_argument("--replicas", type=int, default=1, help="gateway replicas, turns spread over them")
    p.add_argument("--conversations", type=int, default=48)
    p.add_argument("--systems", type=int, default=4)
    p.add_argument("--system-words", type=int, default=250)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--kv-tokens", type=int, default=12_000, help="each emulator's KV cache")
    p.add_argument("--speed", type=float, default=20.0)
    p.add_argument("--think-s", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--scrape-s", type=float, default=0.2,
        help="the gateway's metrics scrape interval (wall time; an emulated step is 20 ms / --speed)",
    )  # fmt: skip
    p.add_argument("--explain", action="store_true", help="exact mode: where prediction and hits part")
    p.add_argument(
        "--queue-discount", choices=("on", "off", "both"), default="on",
        help="exact mode: count only the cached tokens expected to survive the queue (both: off, then on)",
    )  # fmt: skip
    p.add_argument("--state", choices=("memory", "redis"), default="memory", help="the replicas' backend")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--sync-s", type=float, default=0.1, help="--state redis: state.sync_interval_s")
    p.add_argument(
        "--share-in-flight", choices=("on", "off", "both"), default="on",
        help="--state redis: share in-flight work per instance (both: exact mode off, then on)",
    )  # fmt: skip
    p.add_argument("--skip-approximate", action="store_true", help="exact mode only")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    discounts = {"on": (True,), "off": (False,), "both": (False, True)}[a.queue_discount]
    shares = {"on": (True,), "off": (False,), "both": (False, True)}[a.share_in_flight]
    if a.state != "redis":
        shares = (False,)
    results = [] if a.skip_approximate else [asyncio.run(run("approximate", a))]
    results += [asyncio.run(run("exact", a, discount, share)) for discount in discounts for share in shares]
    approx = None if a.skip_approximate else results[0]
    exact = results[-1]
    summary: dict[str, Any] = {
        "seed": a.seed,
        "replicas": a.replicas,
        "approximate": approx,
        "exact": exact,
        "exact_vs_approximate_engine_hits": (
            exact["engine_hit_ratio"] - approx["engine_hit_ratio"] if approx else float("nan")
        ),
        "predicted_vs_engine_relative": _relative(exact),
    }
    if len(discounts) == 2:
        off = results[-1 - len(shares)]
        summary["exact_off"] = off
        summary["off_predicted_vs_engine_relative"] = _relative(off)
    if len(shares) == 2:
        unshared = results[-2]
        summary["exact_unshared"] = unshared
        summary["unshared_predicted_vs_engine_relative"] = _relative(unshared)
    if a.json:
        print(json.dumps(summary))
        return
    for r in results:
        line = f"{r['mode']:>11}: engines' hit ratio {r['engine_hit_ratio']:.4f}"
        if "gateway_predicted_hit_ratio" in r:
            line += f", gateway predicted {r['gateway_predicted_hit_ratio']:.4f}"
            line += f" (matched {r['gateway_matched_hit_ratio']:.4f})"
        print(line + f" ({r['requests']} requests, {r['errors']} errors; {r['reasons']})")
        if "explain" in r:
            print("             " + ", ".join(f"{k} {v:.4g}" for k, v in r["explain"].items()))
    print(
        f"exact - approximate (engines): {summary['exact_vs_approximate_engine_hits']:+.4f}; "
        f"predicted / engines - 1: {summary['predicted_vs_engine_relative']:+.2%}"
    )


if __name__ == "__main__":
    main()
