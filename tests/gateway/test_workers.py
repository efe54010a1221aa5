"""``tokenplane serve --workers N`` and gateway replicas on one PostgreSQL ledger, as real processes.

The gateways are ``python -m tokenplane serve`` processes (the command a user runs) in front of the
in-process fake upstreams; clients are the official ``openai`` client without keep-alive, so each
request opens a connection and the kernel's SO_REUSEPORT spreading shows. Each worker names itself
in its ``/metrics`` (``tokenplane_worker_info``), which is how a test tells where requests landed.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from pg_support import database_url, fresh_database

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "plan the next step of the task"}]
_SERVING = re.compile(r"serving on (http://[^\s]+?)(?: with | \(|$)", re.M)


@pytest.fixture(scope="module")
def pg_ledger_url() -> Iterator[str]:
    with fresh_database() as name:
        yield database_url(name)


class Serve:
    """One ``tokenplane serve`` process (its own session: cleanup can stop its workers too)."""

    def __init__(self, config: dict[str, Any], tmp: Path, name: str, *args: str) -> None:
        cfg = tmp / f"{name}.yaml"
        cfg.write_text(yaml.safe_dump(config))
        self.log = tmp / f"{name}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tokenplane", "serve", str(cfg), "--port", "0", *args],
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.url = ""

    async def ready(self, http: aiohttp.ClientSession, workers: int = 1, timeout_s: float = 90.0) -> str:
        """Wait for the listening line, then for every worker to have said it serves."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            text = self.log.read_text(errors="replace")
            m = _SERVING.search(text)
            if m and (workers == 1 or text.count("(worker ") >= workers):
                self.url = m.group(1)
                break
            assert self.proc.poll() is None, f"serve exited early:\n{text}"
            assert loop.time() < deadline, f"serve not ready in {timeout_s} s:\n{text}"
            await asyncio.sleep(0.1)
        async with http.get(self.url + "/health") as resp:
            assert resp.status == 200
        return self.url

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
async def serve(tmp_path: Path, anyio_backend: str) -> AsyncIterator[Callable[..., Serve]]:
    started: list[Serve] = []

    def make(config: dict[str, Any], name: str, *args: str) -> Serve:
        s = Serve(config, tmp_path, name, *args)
        started.append(s)
        return s

    yield make
    for s in started:
        s.kill()


def client(url: str, key: str) -> openai.AsyncOpenAI:
    """The official client, one new connection per request."""
    http = openai.DefaultAsyncHttpxClient(limits=httpx2.Limits(max_keepalive_connections=0))
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30, http_client=http)


def wf(workflow_id: str, step: int, total: int = 3) -> dict[str, str]:
    return {
        "x-tokenplane-workflow-id": workflow_id,
        "x-tokenplane-step": str(step),
        "x-tokenplane-total-steps": str(total),
    }


async def scrape(http: aiohttp.ClientSession, url: str) -> tuple[str, dict[str, float]]:
    """One ``/metrics`` on a new connection: (the worker's pid, samples summed by name)."""
    async with http.get(url + "/metrics", headers={"Connection": "close"}) as resp:
        text = await resp.text()
    pid, sums = "", {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            sums[s.name] = sums.get(s.name, 0.0) + s.value
            if s.name == "tokenplane_worker_info":
                pid = s.labels["pid"]
    return pid, sums


async def workflow(http: aiohttp.ClientSession, url: str, key: str, wid: str, **kw: Any) -> tuple[int, Any]:
    method = "POST" if "json" in kw else "GET"
    path = f"/v1/workflows/{wid}" + ("/outcome" if method == "POST" else "")
    headers = {"Authorization": f"Bearer {key}", "Connection": "close"}
    async with http.request(method, url + path, headers=headers, **kw) as resp:
        return resp.status, await resp.json(content_type=None)


async def test_workers_and_replicas_share_one_port_and_one_ledger(
    upstreams, names, serve, pg_ledger_url
) -> None:
    """Replica A (``serve``) and replica B (``serve --workers 2``) on one PostgreSQL ledger: B's
    workers both serve requests from one port; a workflow A started is read and settled through B,
    and A sees B's outcome; a worker killed is started again; B's parent stops on SIGINT, A on
    SIGTERM, both cleanly."""
    ups = await upstreams(1)
    config = names.gateway_config(ups, ledger={"url": pg_ledger_url})
    a = serve(config, "replica-a")
    b = serve(config, "replica-b", "--workers", "2")
    async with aiohttp.ClientSession() as http:
        url_b = await b.ready(http, workers=2)
        url_a = await a.ready(http)
        ca, cb = client(url_a, names.KEY), client(url_b, names.KEY)

        # -- B's two workers share its port: requests land on each ------------------------------
        for step in (1, 2):  # one workflow's steps, each on whichever worker its connection reached
            await cb.chat.completions.create(
                model=names.MODEL, messages=MESSAGES, max_tokens=8, extra_headers=wf("wf-w", step)
            )
        plain = 30
        replies = await asyncio.gather(
            *(
                cb.chat.completions.create(model=names.MODEL, messages=MESSAGES, max_tokens=8)
                for _ in range(plain)
            )
        )
        assert all(r.choices[0].message.content for r in replies)
        requests: dict[str, float] = {}
        for _ in range(60):  # scrapes on new connections until both workers answered
            pid, sums = await scrape(http, url_b)
            requests[pid] = sums.get("tokenplane_requests_total", 0.0)
            if len(requests) == 2:
                break
        assert len(requests) == 2, f"every scrape reached one worker: {requests}"
        assert all(n > 0 for n in requests.values()), requests  # both served completions
        assert sum(requests.values()) == plain + 2
        for _ in range(4):  # any worker reads the workflow the two wrote (new connection each time)
            status, body = await poll_workflow(http, url_b, names.KEY, "wf-w", attempts=2)
            assert status == 200 and body["max_step"] == 2

        # -- a workflow A started: B reads it and settles it, A sees the outcome ----------------
        for step in (1, 2):
            await ca.chat.completions.create(
                model=names.MODEL, messages=MESSAGES, max_tokens=8, extra_headers=wf("wf-x", step)
            )
        status, body = await poll_workflow(http, url_b, names.KEY, "wf-x", attempts=2)
        assert body["outcome"] == "open" and body["cost_usd"] > 0
        status, body = await workflow(http, url_b, names.KEY, "wf-x", json={"outcome": "succeeded"})
        assert status == 200 and body["outcome"] == "succeeded" and body["attempts"] == 2
        status, body = await workflow(http, url_a, names.KEY, "wf-x")
        assert status == 200 and body["outcome"] == "succeeded" and body["reason"] == "client"
        status, body = await workflow(http, url_a, names.BATCH_KEY, "wf-x")
        assert status == 404  # another tenant's, through any replica
        _, sums = await scrape(http, url_a)
        assert sums["tokenplane_ledger_available"] == 1 and sums["tokenplane_ledger_buffered_writes"] == 0
        await ca.close()
        await cb.close()

        # -- a worker that dies is started again by its parent ----------------------------------
        pids = [int(p) for p in requests]
        os.kill(pids[0], signal.SIGKILL)
        for _ in range(1200):
            text = b.log.read_text()
            if "starting it again" in text and text.count("(worker ") >= 3:
                break
            await asyncio.sleep(0.05)
        assert text.count("(worker ") >= 3, text
        seen = {(await scrape(http, url_b))[0] for _ in range(30)}
        assert str(pids[0]) not in seen and str(pids[1]) in seen

    assert b.stop(signal.SIGINT) == 0
    text = b.log.read_text()
    assert text.count("shutting down (worker") == 2, text  # the survivor and the new worker
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert a.stop(signal.SIGTERM) == 0


async def poll_workflow(
    http: aiohttp.ClientSession, url: str, key: str, wid: str, *, attempts: int
) -> tuple[int, Any]:
    """The workflow once it shows ``attempts`` (a replica's attempts commit a moment after its answer)."""
    for _ in range(200):
        status, body = await workflow(http, url, key, wid)
        if status == 200 and body["attempts"] == attempts:
            return status, body
        await asyncio.sleep(0.05)
    raise AssertionError(f"{wid}: {status} {body}")


async def test_serve_stops_at_start_when_the_ledger_database_is_unreachable(
    upstreams, names, tmp_path
) -> None:
    """Not an outage to buffer through: a gateway that never reached its ledger does not start
    (exit 2, the address without its password), and leaves nothing running behind it."""
    ups = await upstreams(1)
    url = "postgresql://postgres:s3cret@127.0.0.1:1/tokenplane"
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(yaml.safe_dump(names.gateway_config(ups, ledger={"url": url, "timeout_s": 1})))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tokenplane", "serve", str(cfg), "--port", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    assert proc.returncode == 2, text
    assert "postgresql://127.0.0.1:1/tokenplane" in text and "s3cret" not in text
    assert "Task was destroyed" not in text and "Unclosed" not in text  # it stopped what it started
