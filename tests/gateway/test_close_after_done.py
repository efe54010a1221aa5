"""A client that closes its connection as soon as it has read ``data: [DONE]`` got the whole
answer: the request counts as ``ok``, not ``client_disconnected``. The gateway is a real
``tokenplane serve`` process (uvloop, as deployed): the race is between the relay's last write and
the handler's return, a few loop passes in which the client's close can arrive."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

pytestmark = pytest.mark.anyio

ROUNDS = 120  # 200 such clients without the fix: 4 (fast front) and 31 (aiohttp) miscounted


def _count(text: str, outcome: str) -> float:
    found = re.findall(rf'tokenplane_requests_total{{[^}}]*outcome="{outcome}"[^}}]*}} ([0-9.e+]+)', text)
    return sum(float(v) for v in found)


async def _start(config: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    cmd = [sys.executable, "-m", "tokenplane", "serve", str(config)]
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    for _ in range(600):
        m = re.search(r"serving on http://([\d.]+):(\d+)", log.read_text())
        if m:
            return proc, f"{m.group(1)}:{m.group(2)}"
        assert proc.poll() is None, log.read_text()
        await asyncio.sleep(0.05)
    raise AssertionError("tokenplane serve did not start:\n" + log.read_text())


async def _stream_then_close(host: str, port: int, key: str, model: str) -> None:
    payload = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "short"}], "stream": True}
    ).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {key}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    while True:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        if head.startswith(b"HTTP/1.1 200"):
            break
        # a health check that timed out on this busy test loop: not what is tested here
        assert head.startswith(b"HTTP/1.1 503"), head
        writer.close()
        await asyncio.sleep(0.2)
    got = b""
    while b"data: [DONE]\n\n" not in got:
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        assert chunk, got
        got += chunk
    writer.transport.abort()  # gone the moment the answer is complete


@pytest.mark.parametrize("fast_front", [True, False])
async def test_a_client_closing_right_after_done_is_ok(
    upstreams: Any, names: Any, tmp_path: Path, fast_front: bool
) -> None:
    ups = await upstreams(1)
    ups[0].tokens = 3
    raw = names.gateway_config(
        ups,
        listen={"host": "127.0.0.1", "port": 0, "fast_front": fast_front},
        health={"interval_s": 1.0, "failures_to_down": 1000},  # a busy test loop is no outage
    )
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump(raw))
    log = tmp_path / "gateway.log"
    proc, addr = await _start(config, log)
    host, port = addr.split(":")
    try:
        async with aiohttp.ClientSession() as http:
            auth = {"Authorization": f"Bearer {names.KEY}"}
            for _ in range(200):  # until the instance's first health check passed
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"http://{addr}/v1/instances", headers=auth) as r:
                        if r.status == 200 and all(d["healthy"] for d in (await r.json())["data"]):
                            break
                await asyncio.sleep(0.05)
        for _ in range(ROUNDS // 10):
            await asyncio.gather(
                *(_stream_then_close(host, int(port), names.KEY, names.MODEL) for _ in range(10))
            )
        reader, writer = await asyncio.open_connection(host, int(port))
        text = ""
        for _ in range(100):
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            size = int(re.search(rb"Content-Length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
            text = (await reader.readexactly(size)).decode()
            if _count(text, "ok") + _count(text, "client_disconnected") >= ROUNDS:
                break
            await asyncio.sleep(0.05)
        writer.close()
        gone, ok = _count(text, "client_disconnected"), _count(text, "ok")
        assert (ok, gone) == (ROUNDS, 0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
