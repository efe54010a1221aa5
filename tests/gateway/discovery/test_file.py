"""File discovery: the instances of a config file, re-read when it changes. Under streaming load an
instance swapped for another takes over without a failed request; an invalid file is ignored."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.anyio


async def test_a_changed_file_moves_traffic_without_a_failed_request(
    upstreams: Any, gateway: Any, names: Any, wait: Any, tmp_path: Path
) -> None:
    ups = await upstreams(2)
    for u in ups:
        u.tokens, u.token_delay_s = 8, 0.02
    path = tmp_path / "instances.yaml"
    first = names.gateway_config(ups[:1])
    path.write_text(yaml.safe_dump(first))
    gw = await gateway(ups[:1], discovery={"kind": "file", "path": str(path), "interval_s": 0.05})
    client = gw.client()
    errors: list[BaseException] = []
    done = 0
    running = True

    async def lane(i: int) -> None:
        nonlocal done
        while running:
            try:
                stream = await client.chat.completions.create(
                    model=names.MODEL, messages=[{"role": "user", "content": f"lane {i}"}], stream=True
                )
                parts = [c async for c in stream if c.choices and c.choices[0].delta.content]
                assert len(parts) == 8
                done += 1
            except Exception as exc:  # every failure is the finding
                errors.append(exc)

    lanes = [asyncio.create_task(lane(i)) for i in range(4)]
    try:
        while ups[0].events_written < 4:
            await asyncio.sleep(0.01)
        path.write_text(yaml.safe_dump(names.gateway_config(ups[1:])))  # up-0 out, up-1 in

        async def moved() -> bool:
            return set(await gw.instances()) == {ups[1].name}

        await wait(moved)
        assert ups[0].disconnects == 0, "a stream on the instance leaving was cut"
        served = len(ups[1].requests)
        await wait(lambda: _true(len(ups[1].requests) > served + 4))

        path.write_text("instances: [oops")  # invalid: logged and ignored
        await asyncio.sleep(0.3)
        assert set(await gw.instances()) == {ups[1].name}
    finally:
        running = False
        await asyncio.gather(*lanes)
    assert errors == []
    assert done > 8


async def _true(value: bool) -> bool:
    return value
