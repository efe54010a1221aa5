"""The header memo (the authenticator's and the quota stage's): an answer is the one put for that
header since the last clear, or none; bounded; filed by keyed tag, with no header held."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.gateway.header_memo import HeaderMemo

_headers = st.one_of(st.sampled_from(["Bearer sk-a", "Bearer sk-b", "bearer sk-a", ""]), st.text(max_size=20))
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("put"), _headers, st.integers(0, 9)),
        st.tuples(st.just("get"), _headers, st.just(0)),
        st.tuples(st.just("clear"), st.just(""), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5), _steps)
def test_an_answer_is_the_last_one_put_since_a_clear_or_none(
    limit: int, steps: list[tuple[str, str, int]]
) -> None:
    """Never a wrong answer, and never an answer cleared: a plain dict is the model; the memo may
    only have forgotten more (it starts over when full)."""
    memo: HeaderMemo[int] = HeaderMemo(limit)
    model: dict[str, int] = {}
    for op, header, answer in steps:
        if op == "put":
            memo.put(header, answer)
            model[header] = answer
            assert memo.get(header) == answer  # what was just put is answered
        elif op == "get":
            got = memo.get(header)
            assert got is None or got == model.get(header)
            assert header in model or got is None
        else:
            memo.clear()
            model.clear()
            assert len(memo) == 0
        assert len(memo) <= limit


def test_it_starts_over_past_its_limit() -> None:
    memo: HeaderMemo[str] = HeaderMemo(3)
    for i in range(3):
        memo.put(f"Bearer sk-{i}", f"t{i}")
    assert [memo.get(f"Bearer sk-{i}") for i in range(3)] == ["t0", "t1", "t2"]
    memo.put("Bearer sk-3", "t3")
    assert len(memo) == 1
    assert memo.get("Bearer sk-0") is None and memo.get("Bearer sk-3") == "t3"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(alphabet="abcdefghijk0123456789-", min_size=8, max_size=40), min_size=1, max_size=20))
def test_no_header_is_held(keys: list[str]) -> None:
    memo: HeaderMemo[int] = HeaderMemo(64)
    for i, k in enumerate(keys):
        memo.put(f"Bearer sk-{k}", i)
    held = repr((memo._entries, memo.limit))
    assert not any(f"sk-{k}" in held for k in keys)


def test_a_tag_needs_both_halves() -> None:
    """A header whose first hash matches a remembered one (as a forged collision would) but whose
    salted hash does not gets no answer."""
    memo: HeaderMemo[str] = HeaderMemo(8)
    memo.put("Bearer sk-a", "acme")
    ((_tag, entry),) = memo._entries.items()
    guess = "Bearer sk-wrong-but-secret-looking"
    memo._entries[hash(guess)] = entry  # the first half forged
    assert memo.get(guess) is None


def test_two_memos_tag_apart() -> None:
    """Each memo has its own salt: one's entries are no key to another's."""
    one: HeaderMemo[str] = HeaderMemo(8)
    other: HeaderMemo[str] = HeaderMemo(8)
    one.put("Bearer sk-a", "acme")
    other.put("Bearer sk-a", "acme")
    assert one._entries.keys() == other._entries.keys()
    assert one._entries != other._entries  # the salted halves differ (a chance of 2**-64 not to)


def test_a_memo_holds_at_least_one_header() -> None:
    with pytest.raises(ValueError, match="at least one"):
        HeaderMemo(0)
