"""PoolSync, the one path every discovery source changes the pool through: after any sequence of
wanted sets, the pool serves exactly the wanted instances at their addresses once the leaving ones
are idle; an instance with requests in flight stays (draining, given no new work) until they end."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.gateway import parse_config
from tokenplane.gateway.config import InstanceConfig
from tokenplane.gateway.discovery.base import PoolSync
from tokenplane.gateway.state import Gateway

MODEL = "llama-3-8b"
IDS = ("a", "b", "c", "d")


def _inst(iid: str, port: int) -> InstanceConfig:
    return InstanceConfig(id=iid, url=f"http://10.0.0.1:{port}", model=MODEL)


wanted_sets = st.dictionaries(st.sampled_from(IDS), st.integers(8000, 8001), max_size=len(IDS))


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(wanted_sets, st.sets(st.sampled_from(IDS))), min_size=1, max_size=6))
def test_the_pool_converges_on_the_wanted_set_without_cutting_requests(
    steps: list[tuple[dict[str, int], set[str]]],
) -> None:
    cfg = parse_config(
        {
            "models": [{"name": MODEL}],
            "instances": [{"id": "a", "url": "http://10.0.0.1:8000", "model": MODEL}],
        }
    )
    gw = Gateway(cfg)
    sync = PoolSync(gw, {i.id: i for i in cfg.instances}, drain_timeout_s=3600)
    for wanted, busy in steps:
        for iid in busy:  # requests in flight on these when the change arrives
            u = gw.pool.get(iid)
            if u is not None:
                u.in_flight += 1
        before = {u.id: u for u in gw.pool.all()}
        sync.apply({iid: _inst(iid, port) for iid, port in wanted.items()})
        for iid, u in before.items():
            if u.in_flight:
                assert gw.pool.get(iid) is u, "an instance with requests in flight left the pool"
                if iid not in wanted or u.config.url != _inst(iid, wanted[iid]).url:
                    assert u.draining, "a leaving instance still gets new requests"
        for u in gw.pool.all():  # the requests end
            u.in_flight = 0
        sync.reap()
        sync.reap()  # a changed address: removed, then back under the new one
        got = {u.id: (u.config.url, u.draining) for u in gw.pool.all()}
        assert got == {iid: (_inst(iid, port).url, False) for iid, port in wanted.items()}


def test_an_unknown_model_is_skipped_and_an_autoscaled_instance_is_left_alone() -> None:
    cfg = parse_config(
        {
            "models": [{"name": MODEL}],
            "instances": [{"id": "a", "url": "http://10.0.0.1:8000", "model": MODEL}],
        }
    )
    gw = Gateway(cfg)
    sync = PoolSync(gw, {i.id: i for i in cfg.instances}, drain_timeout_s=3600)
    gw.pool.add(_inst("autoscaled-1", 9000))
    sync.apply({"x": InstanceConfig(id="x", url="http://10.0.0.2:1", model="nope"), "a": cfg.instances[0]})
    sync.reap()
    assert {u.id for u in gw.pool.all()} == {"a", "autoscaled-1"}
