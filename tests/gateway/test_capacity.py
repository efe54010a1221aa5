"""The pool capacity admission reads per request: cached while every breaker is closed, and
recomputed whenever health, draining, membership or a breaker changes what is usable."""

from __future__ import annotations

import time

from tokenplane.gateway.app import Gateway
from tokenplane.gateway.config import GatewayConfig, InstanceConfig


def _gateway() -> Gateway:
    insts = [
        {"id": f"i{k}", "url": f"http://127.0.0.1:{9000 + k}", "model": "m", "max_concurrency": 4 * (k + 1)}
        for k in range(3)
    ]
    breaker = {"consecutive_failures": 1, "cooldown_s": 5.0}
    config = {"models": [{"name": "m"}], "instances": insts, "breaker": breaker}
    return Gateway(GatewayConfig.model_validate(config))


def test_capacity_follows_health_draining_and_membership() -> None:
    gw = _gateway()
    pool = gw.admission["m"]
    assert pool.capacity() == 4 + 8 + 12
    assert pool.capacity() == 24  # the cached read
    i1 = gw.pool.get("i1")
    assert i1 is not None
    i1.healthy = False
    assert pool.capacity() == 16
    i1.healthy = True
    assert pool.capacity() == 24
    gw.pool.drain("i2")
    assert pool.capacity() == 12
    gw.pool.add(InstanceConfig.model_validate({"id": "i9", "url": "http://127.0.0.1:9009", "model": "m"}))
    assert pool.capacity() == 12 + InstanceConfig.model_fields["max_concurrency"].default
    gw.pool.remove("i9")
    assert pool.capacity() == 12


def test_capacity_follows_breakers_through_their_cooldown() -> None:
    gw = _gateway()
    pool = gw.admission["m"]
    board = gw.resilience.board
    assert pool.capacity() == 24
    board.on_result("i0", True, 0.01, now=0.0)  # a breaker that exists, CLOSED: still cached
    assert board.all_closed and pool.capacity() == 24
    board.on_result("i2", False, None, now=0.0)  # one failure opens it (monotonic time is far later)
    assert not board.all_closed
    assert board.allow("i2", now=time.monotonic()) is True  # opened "at 0": its cooldown has passed
    board.on_result("i2", False, None, now=time.monotonic())  # the probe fails: open again, for 5 s
    assert pool.capacity() == 12
    board.forget("i2")
    assert board.all_closed and pool.capacity() == 24
