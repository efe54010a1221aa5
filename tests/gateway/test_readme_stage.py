"""The README's "Adding a stage" example runs: its stage, added to a gateway, changes what the
instance receives."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tokenplane.gateway import parse_config
from tokenplane.gateway.server import GatewayServer

pytestmark = pytest.mark.anyio

README = Path(__file__).resolve().parents[2] / "README.md"


def _example() -> str:
    section = README.read_text().split("### Adding a stage", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the section has no python example"
    return match.group(1)


async def test_the_readme_stage_caps_max_tokens(upstreams, names) -> None:
    ups = await upstreams(1)
    namespace: dict[str, Any] = {"config": parse_config(names.gateway_config(ups))}
    exec(compile(_example(), "README.md", "exec"), namespace)  # builds `app` with the stage
    server = GatewayServer(namespace["app"], "127.0.0.1", 0)
    await server.start()
    try:
        import openai

        url = str(server.make_url("/v1"))
        client = openai.AsyncOpenAI(base_url=url, api_key=names.KEY, max_retries=0, timeout=10)
        messages = [{"role": "user", "content": "hi"}]
        await client.chat.completions.create(model=names.MODEL, messages=messages, max_tokens=200)
        await client.chat.completions.create(model=names.MODEL, messages=messages, max_tokens=4)
        await client.close()
    finally:
        await server.close()
    assert [r["max_tokens"] for r in ups[0].requests] == [16, 4]
