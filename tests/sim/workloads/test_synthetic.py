from __future__ import annotations

import math
import random
import statistics
import time
from itertools import islice, pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.sim.workloads.dists import (
    IntDist,
    LengthDist,
    interarrival_sampler,
    weibull_shape_for_cv,
)
from tokenplane.sim.workloads.synthetic import SyntheticWorkload


def _gaps(w: SyntheticWorkload) -> list[float]:
    times = [s.arrival_s for s in w.arrivals()]
    return [b - a for a, b in zip([0.0, *times[:-1]], times, strict=True)]


@pytest.mark.parametrize(
    ("process", "cv"),
    [("poisson", 1.0), ("gamma", 0.5), ("gamma", 2.0), ("weibull", 0.5), ("weibull", 2.0), ("gamma", 0.0)],
)
def test_mean_rate_and_cv(process: str, cv: float) -> None:
    w = SyntheticWorkload(rate_rps=8.0, num_requests=20_000, process=process, cv=cv, seed=7)  # type: ignore[arg-type]
    gaps = _gaps(w)
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 8.0, rel=0.05)
    assert statistics.pstdev(gaps) / mean == pytest.approx(cv, rel=0.08, abs=1e-9)


def test_weibull_shape_solver() -> None:
    assert weibull_shape_for_cv(1.0) == pytest.approx(1.0, rel=1e-6)  # the exponential
    for cv in (0.1, 0.5, 2.0, 5.0, 9.0):
        k = weibull_shape_for_cv(cv)
        got = math.sqrt(math.gamma(1 + 2 / k) / math.gamma(1 + 1 / k) ** 2 - 1)
        assert got == pytest.approx(cv, rel=1e-6)


def test_interarrival_validation() -> None:
    rng = random.Random(0)
    with pytest.raises(ValueError, match="cv 1"):
        interarrival_sampler(rng, "poisson", 1.0, cv=2.0)
    with pytest.raises(ValueError, match="rate_rps"):
        interarrival_sampler(rng, "gamma", 0.0)
    with pytest.raises(ValueError, match="unknown arrival process"):
        interarrival_sampler(rng, "pareto", 1.0)


def test_length_dists() -> None:
    rng = random.Random(3)
    assert {LengthDist.fixed(5).int_sampler(rng)() for _ in range(10)} == {5}
    uni = LengthDist.uniform(3, 6).int_sampler(rng)
    assert {uni() for _ in range(500)} == {3, 4, 5, 6}
    logn = LengthDist.lognormal(1000, 1.0).int_sampler(rng)
    xs = [logn() for _ in range(40_000)]
    assert statistics.fmean(xs) == pytest.approx(1000, rel=0.05)
    assert statistics.pstdev(xs) / statistics.fmean(xs) == pytest.approx(1.0, rel=0.15)
    capped = LengthDist.lognormal(1000, 2.0, min=10, max=2000).int_sampler(rng)
    assert all(10 <= capped() <= 2000 for _ in range(5000))
    norm = LengthDist.normal(100, 0.1).float_sampler(rng)
    assert statistics.fmean(norm() for _ in range(5000)) == pytest.approx(100, rel=0.02)
    assert LengthDist.uniform(2, 4).mean_value() == 3
    assert IntDist(2, 4).mean_value() == 3
    assert IntDist.of(5) == IntDist.fixed(5)
    with pytest.raises(ValueError):
        LengthDist.uniform(5, 1)
    with pytest.raises(ValueError):
        IntDist(3, 2)


def test_counts_duration_and_fields() -> None:
    w = SyntheticWorkload(rate_rps=100.0, num_requests=50, seed=1, tenant="t", model="m")
    specs = list(w.arrivals())
    assert [s.request_id for s in specs] == list(range(50))
    assert all(s.tenant == "t" and s.model == "m" and s.block_hashes == () for s in specs)
    assert all(s.prompt_tokens >= 1 and s.output_tokens >= 1 for s in specs)
    assert all(s.max_output_tokens == s.output_tokens for s in specs)
    timed = list(SyntheticWorkload(rate_rps=100.0, duration_s=10.0, seed=1).arrivals())
    assert 800 < len(timed) < 1200
    assert timed[-1].arrival_s <= 10.0


def test_deterministic_by_seed() -> None:
    def make(seed: int) -> list[object]:
        w = SyntheticWorkload(
            rate_rps=5, num_requests=200, process="gamma", cv=3.0, seed=seed, shared_prefix_tokens=100
        )
        return list(w.arrivals())

    assert make(1) == make(1)
    assert make(1) != make(2)
    w = SyntheticWorkload(rate_rps=5, num_requests=100, seed=4)
    assert list(w.arrivals()) == list(w.arrivals())


def test_lazy_for_a_billion_requests() -> None:
    w = SyntheticWorkload(rate_rps=1000.0, num_requests=10**9, seed=0, shared_prefix_tokens=64)
    t0 = time.perf_counter()
    head = list(islice(w.arrivals(), 1000))
    assert len(head) == 1000
    assert time.perf_counter() - t0 < 2.0


def test_shared_prefix_hashes() -> None:
    w = SyntheticWorkload(
        rate_rps=10,
        num_requests=400,
        seed=2,
        shared_prefix_tokens=100,  # 6 full blocks of 16 and a partial one
        prefix_groups=3,
        prompt=LengthDist.uniform(1, 200),
    )
    specs = list(w.arrivals())
    heads: dict[tuple[int, ...], int] = {}
    seen_unique: set[int] = set()
    for s in specs:
        assert s.hash_block_tokens == 16
        assert s.prompt_tokens >= 101
        assert len(s.block_hashes) == s.prompt_tokens // 16
        head, own = s.block_hashes[:6], s.block_hashes[6:]
        heads[head] = heads.get(head, 0) + 1
        # The straddling block and everything after it is unique to the request.
        assert seen_unique.isdisjoint(own)
        seen_unique.update(own)
    assert len(heads) == 3
    assert all(n > 80 for n in heads.values())
    assert seen_unique.isdisjoint(h for head in heads for h in head)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    process=st.sampled_from(["poisson", "gamma", "weibull"]),
    cv=st.floats(0.2, 5.0),
    shared=st.integers(0, 300),
    groups=st.integers(1, 4),
    block=st.integers(1, 64),
)
def test_properties(seed: int, process: str, cv: float, shared: int, groups: int, block: int) -> None:
    w = SyntheticWorkload(
        rate_rps=3.0,
        num_requests=60,
        process=process,  # type: ignore[arg-type]
        cv=1.0 if process == "poisson" else cv,
        seed=seed,
        shared_prefix_tokens=shared,
        prefix_groups=groups,
        hash_block_tokens=block,
        prompt=LengthDist.lognormal(200, 1.5),
    )
    specs = list(w.arrivals())
    assert len(specs) == 60
    assert all(a.arrival_s <= b.arrival_s for a, b in pairwise(specs))
    for s in specs:
        if shared:
            assert len(s.block_hashes) == s.prompt_tokens // block
        else:
            assert s.block_hashes == ()
