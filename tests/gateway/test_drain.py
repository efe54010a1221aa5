"""SIGTERM drains `tokenplane serve`: readiness fails at once, new requests are refused with the
OpenAI error shape, the streams in flight all finish, and the process exits 0."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

pytestmark = pytest.mark.anyio

STREAMS = 20
TOKENS = 30
TOKEN_DELAY_S = 0.05  # each stream lasts about 1.5 s


async def _start(config: Path) -> tuple[subprocess.Popen[bytes], str]:
    cmd = [sys.executable, "-m", "tokenplane", "serve", str(config)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    loop = asyncio.get_running_loop()
    lines: list[str] = []
    while True:
        line = (await loop.run_in_executor(None, proc.stderr.readline)).decode()
        lines.append(line)
        if not line:
            raise AssertionError("tokenplane serve exited:\n" + "".join(lines))
        m = re.search(r"serving on (http://\S+)", line)
        if m:
            return proc, m.group(1)


async def _count_streamed(client: openai.AsyncOpenAI, model: str, n: int) -> int:
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": f"stream {n}"}], stream=True
    )
    chunks = 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            chunks += 1
    return chunks


@pytest.mark.parametrize("fast_front", [True, False])
async def test_sigterm_drains_streams_in_flight_and_exits_0(
    upstreams: Any, names: Any, tmp_path: Path, fast_front: bool
) -> None:
    ups = await upstreams(2)
    for u in ups:
        u.tokens, u.token_delay_s = TOKENS, TOKEN_DELAY_S
    raw = names.gateway_config(ups, listen={"host": "127.0.0.1", "port": 0, "fast_front": fast_front})
    raw["drain"] = {"deadline_s": 30}
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump(raw))
    proc, url = await _start(config)
    try:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=names.KEY, max_retries=0, timeout=30)
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/health/ready") as r:
                assert r.status == 200
            tasks = [asyncio.create_task(_count_streamed(client, names.MODEL, i)) for i in range(STREAMS)]
            while sum(u.events_written for u in ups) < STREAMS:  # every stream under way
                await asyncio.sleep(0.01)
            assert sum(len(u.requests) for u in ups) == STREAMS
            os.kill(proc.pid, signal.SIGTERM)
            await asyncio.sleep(0.2)
            # not ready at once, still alive
            async with http.get(url + "/health/ready") as r:
                assert r.status == 503
                assert (await r.json())["status"] == "draining"
            async with http.get(url + "/health") as r:
                assert r.status == 503
            async with http.get(url + "/health/live") as r:
                assert r.status == 200
            # a new request (new connection) is refused with the OpenAI error shape
            fresh = openai.AsyncOpenAI(base_url=url + "/v1", api_key=names.KEY, max_retries=0, timeout=10)
            with pytest.raises(openai.APIStatusError) as refused:
                await fresh.chat.completions.create(
                    model=names.MODEL, messages=[{"role": "user", "content": "late"}]
                )
            assert refused.value.status_code == 503
            assert refused.value.code == "draining"
            assert refused.value.response.headers["Retry-After"]
            await fresh.close()
            assert proc.poll() is None, "exited with streams in flight"
            done = await asyncio.gather(*tasks)
        assert done == [TOKENS] * STREAMS, "every stream in flight finished whole"
        assert sum(len(u.requests) for u in ups) == STREAMS, "the refused request never reached an instance"
        await client.close()
        rc = await asyncio.get_running_loop().run_in_executor(None, proc.wait, 20)
        assert rc == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        assert proc.stderr is not None
        proc.stderr.close()
