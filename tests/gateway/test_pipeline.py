"""The pipeline's runner and composition: stages enter in order, exit in reverse (only those that
entered), an early answer stops the chain, a refusal becomes its OpenAI error answer, and stages a
config does not use are not in the chain."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import pytest
from aiohttp import web

from tokenplane.gateway import create_app, parse_config
from tokenplane.gateway.app import PIPELINE_KEY
from tokenplane.gateway.errors import TenantConcurrencyExceeded
from tokenplane.gateway.stages.context import RequestContext
from tokenplane.gateway.stages.pipeline import Pipeline

pytestmark = pytest.mark.anyio

SENT = web.Response(text="sent")


class _Client:
    """The least of a client stream the runner touches."""

    def answer(self) -> web.StreamResponse:
        return SENT


class _Recorder:
    def __init__(self, name: str, log: list[str], *, fail: bool = False, answer: bool = False) -> None:
        self.name, self.log, self.fail, self.answer = name, log, fail, answer

    def enter(self, ctx: RequestContext) -> Awaitable[None] | None:
        self.log.append(f"enter {self.name}")
        if self.fail:
            raise TenantConcurrencyExceeded(f"{self.name} refuses")
        if self.answer:
            ctx.response = web.Response(text=self.name)
        return self._wait() if self.name.startswith("async") else None

    async def _wait(self) -> None:
        self.log.append(f"waited {self.name}")

    def exit(self, ctx: RequestContext) -> None:
        self.log.append(f"exit {self.name} {ctx.outcome}")


async def _run(*stages: Any) -> web.StreamResponse:
    return await Pipeline(stages, lambda: 0.0).run(_Client(), "chat")  # type: ignore[arg-type]


async def test_stages_enter_in_order_and_exit_in_reverse() -> None:
    log: list[str] = []
    out = await _run(_Recorder("a", log), _Recorder("async-b", log), _Recorder("c", log))
    assert out is SENT
    assert log == [
        "enter a",
        "enter async-b",
        "waited async-b",
        "enter c",
        "exit c ok",
        "exit async-b ok",
        "exit a ok",
    ]


async def test_a_refusal_exits_only_the_stages_that_entered() -> None:
    log: list[str] = []
    out = await _run(_Recorder("a", log), _Recorder("b", log, fail=True), _Recorder("c", log))
    assert isinstance(out, web.Response) and out.status == 429
    outcome = TenantConcurrencyExceeded("x").outcome
    assert log == ["enter a", "enter b", f"exit a {outcome}"]  # the outcome is set before the exits


async def test_an_early_answer_stops_the_chain() -> None:
    log: list[str] = []
    out = await _run(_Recorder("a", log, answer=True), _Recorder("b", log))
    assert isinstance(out, web.Response) and out.text == "a"
    assert log == ["enter a", "exit a ok"]


def _names(config: dict[str, Any]) -> list[str]:
    app = create_app(parse_config(config))
    return [type(s).__name__ for s in app[PIPELINE_KEY].stages]


def _config(**model: Any) -> dict[str, Any]:
    return {
        "models": [{"name": "m", **model}],
        "instances": [{"id": "i0", "url": "http://127.0.0.1:9000", "model": "m"}],
    }


def test_unused_stages_are_not_in_the_chain() -> None:
    assert _names(_config()) == ["Respond", "Authenticate", "Parse", "TenantLimits", "Admission", "Forward"]
    assert _names(_config(response_cache={"enabled": True})) == [
        "Respond", "Authenticate", "Parse", "Cache", "TenantLimits", "Admission", "Forward",
    ]  # fmt: skip
    assert "WorkingSet" in _names(_config(kv_working_set_fraction=0.8))
