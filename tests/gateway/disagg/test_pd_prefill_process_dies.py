"""A prefill instance that dies right after handing over (a real process that exits): the decode
instance cannot pull the KV (connection refused), fails as vLLM does, and the gateway prefills again
on the other prefill instance; the client sees one whole answer."""

from __future__ import annotations

import json
import subprocess
import sys

import aiohttp
import pytest
from emulator_process import wait_ready
from ports import free_port

from tokenplane.emulator.protocol import TextGen

pytestmark = pytest.mark.anyio

MODEL = "llama-3-8b"
PROMPT = "A prefill instance that dies takes its KV cache with it. " * 6
KV = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})


async def test_prefill_process_exiting_after_handover_is_prefilled_again(pd_fleet) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "tokenplane.emulator", "--port", str(port), "--speed", "50"]
    cmd += ["--fixed-step-ms", "20", "--kv-transfer-config", KV]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, proc, 60.0)
        fault = {"exit_after_handover": True}
        async with aiohttp.ClientSession() as http, http.post(url + "/admin/faults", json=fault) as r:
            assert r.status == 200
        # p0 is the process (the pair router's first pick among equals), p1 an in-process emulator
        fleet = await pd_fleet(1, 1, process_prefill=url)
        r = await fleet.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=10)
        assert r.choices[0].text == "".join(TextGen(f"0\0{PROMPT}").words(10))
        assert proc.wait(timeout=10) == 17  # it answered the prefill, then exited
        events = await fleet.events()
        assert events["handover"] == 2 and events["kv_transfer_failed"] == 1
        assert await fleet.decode[0].metric("vllm:nixl_num_failed_transfers_total") == 1
        assert await fleet.prefill[1].metric("tokenplane_emulator_kv_pulls_served_total") == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
