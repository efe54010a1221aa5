"""The gateway's whole request path in one process, without sockets: CPU per request, steadily.

``bench/gateway_overhead.py`` is the real measure (real sockets, separate processes), but on a
shared 2-core machine its figures drift by ~30 % between runs, which hides a change of a few
microseconds; ``bench/gateway_stages.py`` times the pure stages alone, but not what joins them
(the event loop, tasks, futures, the front, the upstream client, the ledger's batching). This
script runs everything of ``tokenplane serve`` on the request path: the fast front, the completion
handler with the same configuration as ``gateway_overhead.py`` (prefix-affinity routing over 4
instances, admission, breakers, retry plan, the in-memory ledger, metrics) and the hot-path upstream
client with its HTTP parser. Only the two sockets are replaced by in-memory transports: a client's
next request is delivered as soon as its answer is written, and an instance "answers" each request
with prebuilt bytes in the next loop iteration (health checks and scrapes, off the request path, go
to a real fake upstream process). So the figure is the gateway's own CPU per request, less the
socket system calls and the kernel's share, with concurrency held constant.

On a noisy machine even this figure drifts by 20-40 % between runs (the host throttles the whole
VM); ``--instructions`` counts the instructions the process executes instead (under valgrind's
callgrind: deterministic to about 1 %, but blind to cache misses and system calls), as the
difference of a short and a long run divided by the requests between them, so that start-up
cancels out; ``--baseline-src`` counts another checkout's too, side by side.

Usage::

    python bench/gateway_inproc.py                     # non-stream, 32 connections
    python bench/gateway_inproc.py --stream --chunks 64 --concurrency 256
    python bench/gateway_inproc.py --json
    python bench/gateway_inproc.py --instructions --baseline-src /tmp/base   # ~2 minutes

Tokenization's cost (``models[].tokenizer``): ``--conversations`` sends growing multi-turn chats
of realistic size instead (a ~400-token system prompt, then turns of ~80 user and ~160 assistant
tokens, 8 turns per conversation, one conversation at a time per connection), and
``--tokenizer DIR`` gives the model that tokenizer folder; the instances publish KV events to a
bound endpoint, so the request path is the precise one::

    python tests/support/tiny_tokenizer.py /tmp/tok32k 32000
    python bench/gateway_inproc.py --instructions --conversations              # without
    python bench/gateway_inproc.py --instructions --conversations --tokenizer /tmp/tok32k
    python bench/gateway_inproc.py --instructions --conversations --tokenizer /tmp/tok32k --encoder hf

``--paragraphs`` lays the conversations' texts out as chat is (paragraphs apart, lists, code blocks
of indented lines, sometimes two spaces after a full stop) instead of words one space apart.

``--encoder`` picks the library that encodes (``models[].tokenizer.encoder``: ``auto`` takes
fastokens, else tiktoken, where it is exact for the tokenizer, ``hf`` the ``tokenizers`` library
always).

Single-turn chats (no prefix reuse: every request renders and tokenizes its whole prompt) are the
default bodies; ``--kv-events`` binds the endpoints without a tokenizer too::

    python bench/gateway_inproc.py --instructions --kv-events                  # without
    python bench/gateway_inproc.py --instructions --tokenizer /tmp/tok32k
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _fake_upstream as fake  # noqa: E402
import gateway_overhead as load  # noqa: E402  (the same config, bodies and fake upstream)

from tokenplane.gateway import create_app, parse_config  # noqa: E402
from tokenplane.gateway.app import GATEWAY_KEY  # noqa: E402
from tokenplane.gateway.server import GatewayServer  # noqa: E402

try:  # the layout since the pipeline redesign; the baseline (--baseline-src) has the old one
    from tokenplane.gateway.transports.httptools_client import UpstreamClient
except ImportError:  # pragma: no cover
    from tokenplane.gateway.upstream_client import UpstreamClient  # type: ignore[no-redef]
from tokenplane.runloop import freeze_startup_objects, new_event_loop  # noqa: E402

DEFAULT_N = 20_000
TURNS = 8
_WORDS = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "it",
    "for",
    "on",
    "with",
    "as",
    "was",
    "at",
    "by",
    "an",
    "be",
    "this",
    "which",
    "from",
    "or",
    "have",
    "not",
    "are",
    "request",
    "gateway",
    "instance",
    "model",
    "token",
    "cache",
    "prefix",
    "block",
    "route",
    "answer",
    "question",
    "system",
    "user",
    "conversation",
    "latency",
    "memory",
    "engine",
    "batch",
    "queue",
    "policy",
    "tenant",
    "limit",
    "stream",
    "reply",
    "summary",
    "table",
    "report",
    "figure",
    "value",
    "number",
    "measure",
    "average",
    "change",
    "result",
    "test",
    "error",
    "retry",
    "budget",
    "schedule",
]


def _words(rng: random.Random, n: int) -> str:
    return " ".join(
        rng.choice(_WORDS) if rng.random() > 0.05 else str(rng.randint(0, 99_999)) for _ in range(n)
    )


def _paragraphs(rng: random.Random, n: int) -> str:
    """About ``n`` words as chat text is laid out: paragraphs apart ("\\n\\n"), now and then two
    spaces after a full stop, a list, or a code block of indented lines."""
    out: list[str] = []
    left = n
    while left > 0:
        kind = rng.random()
        if kind < 0.2:  # a code block: 4-space and 8-space indents, a blank line inside
            lines = [f"def {rng.choice(_WORDS)}(x):"]
            for i in range(rng.randint(2, 5)):
                lines.append(
                    " " * (4 if i % 2 == 0 else 8) + f"{rng.choice(_WORDS)} = x + {rng.randint(0, 99)}"
                )
            lines.insert(2, "")
            out.append("```python\n" + "\n".join(lines) + "\n```")
            left -= 4 * len(lines)
        elif kind < 0.35:  # a list
            items = rng.randint(2, 4)
            out.append("\n".join(f"- {_words(rng, 6)}" for _ in range(items)))
            left -= 6 * items
        else:  # sentences, some with two spaces after them
            sentences = [_words(rng, rng.randint(6, 14)).capitalize() + "." for _ in range(rng.randint(1, 4))]
            out.append("".join(s + ("  " if rng.random() < 0.3 else " ") for s in sentences).rstrip())
            left -= 10 * len(sentences)
    return "\n\n".join(out)


def _conversation_requests(lane: int, stream: bool, paragraphs: bool = False) -> Any:
    """One connection's requests: growing conversations, one after another (a fixed seed per lane)."""
    import msgspec

    rng = random.Random(lane)
    head = load._request_head(auth=True)
    words = _paragraphs if paragraphs else _words
    while True:
        messages: list[dict[str, str]] = [{"role": "system", "content": words(rng, 300)}]
        for _ in range(TURNS):
            messages.append({"role": "user", "content": words(rng, 60)})
            body: dict[str, Any] = {"model": load.MODEL, "messages": messages, "max_tokens": 64}
            if stream:
                body |= {"stream": True, "stream_options": {"include_usage": True}}
            raw = msgspec.json.encode(body)
            yield head + b"Content-Length: %d\r\n\r\n" % len(raw) + raw
            messages.append({"role": "assistant", "content": words(rng, 120)})


class _Transport:
    """The least of ``asyncio.Transport`` the front and the client use; writes go to ``on_write``."""

    def __init__(self, on_write: Any) -> None:
        self.on_write = on_write
        self.closing = False
        self.protocol: Any = None

    def write(self, data: bytes) -> None:
        self.on_write(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol: Any) -> None:
        raise RuntimeError("a request left the fast front: this bench sends only completions")


def _answer(stream: bool, chunks: int) -> list[bytes]:
    """What an instance sends for one request, as the reads that deliver it (a stream: the head
    with the first event, then one event per read, as a decoding instance sends them)."""
    if not stream:
        return [fake._json_response(chunks)]
    toks, usage, done = fake._events(chunks)
    return [fake._SSE_HEAD + toks[0], *toks[1:], usage, done]


def _in_memory_client(answer: list[bytes]) -> UpstreamClient:
    """The hot-path client, its connections answered in memory (the real parser reads the
    answer), a read per loop iteration."""

    async def connect(
        loop: asyncio.AbstractEventLoop, conn: Any, host: str, port: int, timeout_s: float | None
    ) -> None:
        def deliver(i: int) -> None:
            conn.data_received(answer[i])
            if i + 1 < len(answer):
                loop.call_soon(deliver, i + 1)

        t = _Transport(lambda _data: loop.call_soon(deliver, 0))
        t.protocol = conn
        conn.connection_made(t)

    return UpstreamClient(connect_timeout_s=None, read_timeout_s=None, connector=connect)


class ChainedClients:
    """In-memory clients on a gateway's fast front, each sending its next request as soon as the
    last answer is whole (a stream: at its closing chunk), so concurrency holds constant. The CPU
    clock is read in the answers themselves, at the warm-up's last and at the run's last: the
    clients chain each request off the last answer, so a whole run may finish within one tick of a
    coroutine that polls them."""

    def __init__(self, n: int, warmup: int, *, stream: bool = False) -> None:
        """Make it just before the first :meth:`open`: with no warm-up, measuring starts here."""
        self.n, self.warmup = n, warmup
        self.stream, self.end_marker = stream, b"0\r\n\r\n" if stream else b""
        self.answered = self.bad = 0
        self.clock: dict[str, float] = {}  # CPU time when the warm-up ends and when the last answer lands
        self.loop = asyncio.get_running_loop()
        self.done = self.loop.create_future()
        if warmup == 0:
            self.clock["start"] = time.process_time()

    def open(self, server: GatewayServer, request: Any) -> None:
        """One client on ``server``'s front; ``request()`` makes each request's bytes."""
        assert server.front is not None
        proto = server.front.protocol()
        pending = bytearray()

        def on_write(data: bytes) -> None:
            pending.extend(data)
            if self.stream and not pending.endswith(self.end_marker):
                return  # the rest of the stream is to come
            if not pending.startswith(b"HTTP/1.1 200 "):
                self.bad += 1
            pending.clear()
            self.answered += 1
            if self.answered == self.warmup:
                self.clock["start"] = time.process_time()
            if self.answered >= self.n + self.warmup:
                if not self.done.done():
                    self.clock["end"] = time.process_time()
                    self.done.set_result(None)
                return
            self.loop.call_soon(proto.data_received, request())

        t = _Transport(on_write)
        t.protocol = proto
        proto.connection_made(t)  # type: ignore[arg-type]
        proto.data_received(request())

    async def cpu_ms(self) -> float:
        """CPU ms per measured request, once the last answer has landed."""
        await self.done
        return (self.clock["end"] - self.clock["start"]) / self.n * 1e3

    def check(self) -> None:
        if self.bad:
            raise SystemExit(f"{self.bad} answers were not 200: the bench is broken")


async def _drive(
    config: dict[str, Any],
    n: int,
    warmup: int,
    conc: int,
    stream: bool,
    answer: list[bytes],
    conversations: bool = False,
    pregen: int = 0,
    paragraphs: bool = False,
) -> float:
    app = create_app(parse_config(config))
    app.on_startup.append(freeze_startup_objects)
    server = GatewayServer(app, "127.0.0.1", 0)
    await server.start()
    app[GATEWAY_KEY].upstream_client = _in_memory_client(answer)
    heads, tail = load._bodies(stream, 1200)
    req_head = load._request_head(auth=True)
    counter = itertools.count()

    def fixed_request() -> bytes:
        return load._request(req_head, heads, tail, next(counter))

    # conversations: every body made before the first request (the same number in the short and the
    # long run under --instructions, so that making them cancels out)
    per_lane = (max(pregen, n) + warmup) // conc + 2
    ready = (
        [
            list(itertools.islice(_conversation_requests(lane, stream, paragraphs), per_lane))
            for lane in range(conc)
        ]
        if conversations
        else []
    )
    clients = ChainedClients(n, warmup, stream=stream)
    for lane in range(conc):
        clients.open(server, iter(ready[lane]).__next__ if conversations else fixed_request)
    cpu = await clients.cpu_ms()
    await server.close()
    clients.check()
    return cpu


def _instructions(src: Path | None, a: argparse.Namespace) -> float:
    """Instructions per request: two runs under callgrind (``a.n`` and ``4 * a.n`` requests, at
    once on two cores), their difference over the requests between them."""
    import concurrent.futures
    import os

    env = dict(os.environ, PYTHONHASHSEED="0")
    if src is not None:
        env["PYTHONPATH"] = str(src / "src")
    common = ["--warmup", str(a.warmup), "--rounds", "1", "--concurrency", str(a.concurrency)]
    common += ["--chunks", str(a.chunks)] + (["--stream"] if a.stream else [])
    common += (["--conversations"] if a.conversations else []) + (["--paragraphs"] if a.paragraphs else [])
    common += ["--tokenizer", str(a.tokenizer)] if a.tokenizer else []
    common += ["--kv-events"] if a.kv_events else []
    common += ["--encoder", a.encoder]

    def count(n: int) -> int:
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
               str(Path(__file__).resolve()), "--n", str(n), "--pregen", str(4 * a.n), *common]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        for line in proc.stderr.splitlines():
            if "Collected :" in line:
                return int(line.rsplit(" ", 1)[1])
        raise SystemExit(f"callgrind reported no count:\n{proc.stderr[-2000:]}")

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        short, long = pool.map(count, (a.n, 4 * a.n))
    return (long - short) / (3 * a.n)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=DEFAULT_N, help="measured requests")
    p.add_argument("--warmup", type=int, default=3_000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--chunks", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="best of this many runs")
    p.add_argument("--json", action="store_true")
    p.add_argument("--instructions", action="store_true", help="count instructions under callgrind")
    p.add_argument("--baseline-src", type=Path, help="with --instructions: another checkout, counted too")
    p.add_argument("--conversations", action="store_true", help="growing multi-turn chats (see above)")
    p.add_argument(
        "--paragraphs",
        action="store_true",
        help="with --conversations: texts laid out as chat is (paragraph breaks, indented code, two spaces)",
    )
    p.add_argument("--tokenizer", type=Path, help="the model's tokenizer folder (models[].tokenizer)")
    p.add_argument(
        "--encoder",
        choices=("auto", "fastokens", "tiktoken", "hf"),
        default="auto",
        help="with --tokenizer: models[].tokenizer.encoder (hf: the tokenizers library always)",
    )
    p.add_argument(
        "--kv-events",
        action="store_true",
        help="bind KV-event endpoints without --conversations or --tokenizer too (a single-turn run "
        "without a tokenizer that differs from one with only in the tokenizer)",
    )
    p.add_argument("--pregen", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.instructions:
        if shutil.which("valgrind") is None:
            raise SystemExit("--instructions needs valgrind (apt install valgrind)")
        if a.n == DEFAULT_N:
            a.n, a.warmup = (200, 256) if a.stream else (400, 300)
        kind = ("stream" if a.stream else "non-stream") + (" conversations" if a.conversations else "")
        kind += " paragraphs" if a.paragraphs else ""
        kind += f" tokenizer={a.tokenizer} encoder={a.encoder}" if a.tokenizer else ""
        here = _instructions(None, a)
        out = {"kind": kind, "concurrency": a.concurrency, "instructions_per_req": here}
        line = f"{kind} c{a.concurrency}: {here:,.0f} instructions per request"
        if a.baseline_src is not None:
            base = _instructions(a.baseline_src, a)
            out |= {"baseline_instructions_per_req": base, "ratio": here / base}
            line += f"; baseline {base:,.0f}; ratio {here / base:.3f}"
        print(json.dumps(out) if a.json else line)
        return
    ports = load._free_ports(4)
    upstream = subprocess.Popen(
        [sys.executable, str(HERE / "_fake_upstream.py"), "--ports", ",".join(map(str, ports)),
         "--chunks", str(a.chunks), "--delay-ms", "0"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert upstream.stdout is not None
        upstream.stdout.readline()  # "ready": health checks find the instances up
        cfg = load._gateway_config(ports, 0)
        # Scrapes and health checks are off the request path: rare, so that they do not blur
        # the figure (under an instruction counter, 50 times slower, they would be 50 times as many).
        cfg["scrape"] = {"interval_s": 3600.0}
        cfg["health"] = {"interval_s": 3600.0}
        if (
            a.conversations or a.tokenizer or a.kv_events
        ):  # the precise path: KV events bound (nobody publishes)
            for inst in cfg["instances"]:
                inst["kv_events"] = {"endpoint": "tcp://127.0.0.1:*"}
        if a.tokenizer:
            cfg["models"][0]["tokenizer"] = {"path": str(a.tokenizer)}
            if a.encoder != "auto":  # (a --baseline-src checkout may predate the knob)
                cfg["models"][0]["tokenizer"]["encoder"] = a.encoder
        answer = _answer(a.stream, a.chunks)
        best = float("inf")
        for _ in range(a.rounds):
            loop = new_event_loop()
            try:
                drive = _drive(
                    cfg,
                    a.n,
                    a.warmup,
                    a.concurrency,
                    a.stream,
                    answer,
                    a.conversations,
                    a.pregen,
                    a.paragraphs,
                )
                best = min(best, loop.run_until_complete(drive))
            finally:
                loop.close()
            gc.unfreeze()
            gc.collect()
        kind = ("stream" if a.stream else "non-stream") + (" conversations" if a.conversations else "")
        kind += " paragraphs" if a.paragraphs else ""
        kind += f" tokenizer={a.tokenizer} encoder={a.encoder}" if a.tokenizer else ""
        if a.json:
            print(json.dumps({"kind": kind, "concurrency": a.concurrency, "cpu_ms_per_req": best}))
        else:
            print(
                f"{kind} c{a.concurrency}: gateway CPU {best * 1e3:.1f} us per request (best of {a.rounds})"
            )
    finally:
        upstream.terminate()
        upstream.wait()


if __name__ == "__main__":
    main()
