"""The emulator as a real process (``python -m tokenplane.emulator``), including the process-exit fault."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aiohttp
import openai
import pytest
from emulator_process import wait_ready
from ports import free_port

MODEL = "emu-8b"


def test_subprocess_serves_and_dies_on_demand() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "tokenplane.emulator", "--port", str(port), "--speed", "20"]
    cmd += ["--served-model-name", MODEL, "--gpu", "A100", "--max-num-seqs", "64"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    async def body() -> None:
        await wait_ready(url, proc, 15.0)
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=10)
        try:
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=6,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [c async for c in stream]
            assert chunks[-1].usage.completion_tokens == 6
            async with aiohttp.ClientSession() as http:
                async with http.get(url + "/metrics") as r:
                    text = await r.text()
                assert f'vllm:generation_tokens_total{{engine="0",model_name="{MODEL}"}} 6.0' in text
                async with http.post(
                    url + "/admin/faults", json={"die_after_tokens": 2, "exit_process": True}
                ) as r:
                    assert r.status == 200
            got = 0
            with pytest.raises((openai.APIError, OSError)):
                stream = await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=50, stream=True
                )
                async for c in stream:
                    if c.choices and c.choices[0].delta.content:
                        got += 1
            assert got == 2
        finally:
            await client.close()

    try:
        asyncio.run(asyncio.wait_for(body(), 30))
        assert proc.wait(timeout=10) == 17
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        out = proc.stdout.read().decode()
        assert "tokenplane emulate" in out
