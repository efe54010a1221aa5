"""The emulator's P/D roles (vLLM's NixlConnector flow, ``--kv-transfer-config``), over HTTP with the
official openai client: the prefill's handover, the decode's pull into its prefix cache, and vLLM's
answers when the KV cannot be loaded or the parameters are bad."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenplane.emulator.kv_transfer import (
    KvParamsError,
    KvTransferConfig,
    parse_kv_transfer_config,
    remote_prefill,
)
from tokenplane.emulator.protocol import TextGen

PROMPT = "The prefill instance computes this prompt once. " * 10
PREFILL = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None}


def pair(emu: Any, fn: Any, **kw: Any) -> None:
    """Run ``fn(prefill, decode)`` against two emulators with a KV connector."""
    kw.setdefault("kv_transfer", KvTransferConfig())

    async def main() -> None:
        async with emu.emulator(**kw) as p, emu.emulator(**kw) as d:
            await asyncio.wait_for(fn(p, d), 20)

    asyncio.run(main())


async def prefill(p: Any, **extra: Any) -> dict[str, Any]:
    r = await p.client.completions.create(
        model="llama-3-8b", prompt=PROMPT, max_tokens=1, extra_body={"kv_transfer_params": PREFILL, **extra}
    )
    params = r.model_extra["kv_transfer_params"]
    assert isinstance(params, dict)
    return params


def test_prefill_hands_over_and_decode_pulls_the_kv(emu) -> None:
    async def body(p: Any, d: Any) -> None:
        params = await prefill(p)
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        assert params["remote_num_tokens"] > 0 and params["remote_port"] == int(p.url.rsplit(":", 1)[1])
        assert len(params["remote_block_ids"][0]) == -(-params["remote_num_tokens"] // 16)
        r = await d.client.completions.create(
            model="llama-3-8b", prompt=PROMPT, max_tokens=8, extra_body={"kv_transfer_params": params}
        )
        assert r.choices[0].text == "".join(TextGen(f"0\0{PROMPT}").words(8))
        prompt = r.usage.prompt_tokens
        assert r.usage.prompt_tokens_details.cached_tokens == (prompt - 1) // 16 * 16  # pulled, not computed
        pm, dm = await p.metrics(), await d.metrics()
        assert pm["tokenplane_emulator_kv_handovers_total"] == 1
        assert pm["tokenplane_emulator_kv_pulls_served_total"] == 1
        assert dm["tokenplane_emulator_kv_pulls_total"] == 1
        assert dm["tokenplane_emulator_kv_bytes_pulled_total"] == prompt * 131072  # llama-3-8b's KV/token
        assert dm["vllm:nixl_num_failed_transfers_total"] == 0
        # as vLLM counts them: pulled KV is an external hit, not a local prefix-cache one
        assert dm["vllm:external_prefix_cache_hits_total"] == r.usage.prompt_tokens_details.cached_tokens
        assert dm["vllm:prefix_cache_hits_total"] == 0

    pair(emu, body, speed=50.0, fixed_step_s=0.02)


@pytest.mark.parametrize("why", ["read_twice", "kv_lost", "engine_gone"])
def test_a_kv_load_that_fails_fails_as_vllm_does(emu, why: str) -> None:
    """vLLM's ``kv_load_failure_policy: fail``: 500 ``Internal server error`` for a plain request;
    for a stream, its role chunk then an error event."""

    async def body(p: Any, d: Any) -> None:
        params = await prefill(p)
        if why == "read_twice":
            await d.client.completions.create(
                model="llama-3-8b", prompt=PROMPT, max_tokens=2, extra_body={"kv_transfer_params": params}
            )
        elif why == "kv_lost":
            await p.faults(kv_lost=True)
        else:
            params = {**params, "remote_engine_id": "another-engine"}
        with pytest.raises(openai.InternalServerError) as info:
            await d.client.completions.create(
                model="llama-3-8b", prompt=PROMPT, max_tokens=4, extra_body={"kv_transfer_params": params}
            )
        assert info.value.body["message"] == "Internal server error"
        body = {
            "model": "llama-3-8b",
            "messages": [{"role": "user", "content": PROMPT}],
            "stream": True,
            "kv_transfer_params": params,
        }
        async with aiohttp.ClientSession() as http, http.post(d.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
            events = (await r.text()).split("\n\n")
        assert '"role":"assistant"' in events[0]
        assert events[1].startswith('data: {"error":') and "Internal server error" in events[1]
        assert events[2] == "data: [DONE]"
        assert (await d.metrics())["vllm:nixl_num_failed_transfers_total"] == 2

    pair(emu, body, speed=50.0, fixed_step_s=0.02)


def test_recompute_policy_computes_the_prompt_instead(emu) -> None:
    async def body(p: Any, d: Any) -> None:
        params = await prefill(p)
        await p.faults(kv_lost=True)
        r = await d.client.completions.create(
            model="llama-3-8b", prompt=PROMPT, max_tokens=3, extra_body={"kv_transfer_params": params}
        )
        assert r.usage.completion_tokens == 3 and r.usage.prompt_tokens_details.cached_tokens == 0

    pair(
        emu,
        body,
        speed=50.0,
        fixed_step_s=0.02,
        kv_transfer=KvTransferConfig(kv_load_failure_policy="recompute"),
    )


def test_bad_parameters_get_a_precise_error_and_missing_ones_are_ignored(emu) -> None:
    async def body(p: Any, d: Any) -> None:
        params = await prefill(p)
        for key, value in (("remote_port", "5600"), ("remote_block_ids", [["a"]]), ("remote_engine_id", 7)):
            with pytest.raises(openai.BadRequestError) as info:
                await d.client.completions.create(
                    model="llama-3-8b",
                    prompt=PROMPT,
                    max_tokens=2,
                    extra_body={"kv_transfer_params": {**params, key: value}},
                )
            assert info.value.body["param"] == f"kv_transfer_params.{key}"
            assert key in info.value.body["message"]
        missing = {k: v for k, v in params.items() if k != "remote_host"}  # vLLM: warn, compute locally
        r = await d.client.completions.create(
            model="llama-3-8b", prompt=PROMPT, max_tokens=2, extra_body={"kv_transfer_params": missing}
        )
        assert r.usage.prompt_tokens_details.cached_tokens == 0
        assert (await d.metrics())["tokenplane_emulator_kv_pulls_total"] == 0

    pair(emu, body, speed=50.0, fixed_step_s=0.02)


def test_without_a_connector_the_parameters_are_ignored(emu) -> None:
    async def body(e: Any) -> None:
        r = await e.client.completions.create(
            model="llama-3-8b", prompt=PROMPT, max_tokens=1, extra_body={"kv_transfer_params": PREFILL}
        )
        assert r.model_extra["kv_transfer_params"] is None

    emu.run(body, speed=50.0, fixed_step_s=0.02)


def test_kv_transfer_config_parses_vllms_json() -> None:
    c = parse_kv_transfer_config('{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}')
    assert c.produces and not c.consumes and c.kv_load_failure_policy == "fail"
    for bad, why in (
        ("{", "not JSON"),
        ('{"kv_connector": "LMCacheConnectorV1"}', "NixlConnector"),
        ('{"kv_connector": "NixlConnector", "kv_role": "x"}', "kv_role"),
        ('{"kv_connector": "NixlConnector", "kv_load_failure_policy": "retry"}', "kv_load_failure_policy"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_kv_transfer_config(bad)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "do_remote_prefill",
                "remote_engine_id",
                "remote_request_id",
                "remote_host",
                "remote_port",
                "tp_size",
                "remote_block_ids",
                "remote_num_tokens",
            ]
        ),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-3, 70000),
            st.text(max_size=5),
            st.lists(st.integers(-1, 9), max_size=3),
            st.lists(st.lists(st.integers(0, 9), max_size=3), max_size=2),
        ),
    )
)
def test_remote_prefill_never_fails_but_with_a_named_field(params: dict[str, Any]) -> None:
    """Any parameters: nothing to pull, a well-typed pull, or KvParamsError naming one field."""
    try:
        got = remote_prefill(params)
    except KvParamsError as exc:
        assert exc.param.startswith("kv_transfer_params.") and exc.param.split(".", 1)[1] in params
        return
    if got is not None:
        assert params.get("do_remote_prefill")
        assert isinstance(got.port, int) and all(isinstance(b, int) and b >= 0 for b in got.block_ids)
