from hypothesis import given
from hypothesis import strategies as st

from tokenplane.core.prompt_hash import approx_tokens, block_hashes, render_chat


def test_shared_prefix_shares_leading_hashes() -> None:
    base = "x" * 64 * 3
    a = block_hashes(base + "a" * 64)
    b = block_hashes(base + "b" * 64)
    assert a[:3] == b[:3] and a[3] != b[3]
    assert len(block_hashes("y" * 63)) == 0


def test_chain_depends_on_everything_before() -> None:
    a = block_hashes("a" * 64 + "z" * 64)
    b = block_hashes("b" * 64 + "z" * 64)
    assert a[1] != b[1]


def test_render_chat_is_canonical() -> None:
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert render_chat(msgs) == "<|system|>\ns\n<|user|>\nhi\n"
    assert approx_tokens("") == 1 and approx_tokens("abcde") == 2


@given(st.text(), st.text())
def test_prefix_property(p: str, q: str) -> None:
    hp, hpq = block_hashes(p), block_hashes(p + q)
    assert hpq[: len(hp)] == hp
    assert all(0 <= h < 2**63 for h in hpq)
