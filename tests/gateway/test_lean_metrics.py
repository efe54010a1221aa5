"""The request path's lean counters and histograms expose exactly what prometheus_client's own do."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tokenplane.gateway.lean_metrics import LeanCounter, LeanHistogram

BUCKETS = (0.005, 0.01, 0.025, 0.1, 1.0, 30.0)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            if not s.name.endswith("_created"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


observations = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.one_of(st.sampled_from(BUCKETS), st.floats(0.0, 100.0, allow_nan=False)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(observations)
def test_same_series_as_prometheus_client(obs: list[tuple[str, float]]) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    lh = LeanHistogram("x_seconds", "x", ["m"], buckets=BUCKETS, registry=ours)
    lc = LeanCounter("x_requests", "x", ["m"], registry=ours)
    ph = Histogram("x_seconds", "x", ["m"], buckets=BUCKETS, registry=theirs)
    pc = Counter("x_requests", "x", ["m"], registry=theirs)
    for label, v in obs:  # bucket bounds themselves included: le is "less than or equal"
        lh.labels(label).observe(v)
        ph.labels(label).observe(v)
        lc.labels(label).inc(v)
        pc.labels(label).inc(v)
    a, b = _samples(ours), _samples(theirs)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == pytest.approx(b[k]), k


def test_bad_labels_and_buckets_are_refused() -> None:
    reg = CollectorRegistry()
    h = LeanHistogram("h", "h", ["m", "n"], buckets=BUCKETS, registry=reg)
    with pytest.raises(ValueError, match="takes labels"):
        h.labels("only-one")
    with pytest.raises(ValueError, match="increasing"):
        LeanHistogram("g", "g", [], buckets=(1.0, 0.5), registry=reg)
    with pytest.raises(ValueError, match="only go up"):
        LeanCounter("c", "c", [], registry=reg).labels().inc(-1)
