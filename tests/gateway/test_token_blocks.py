"""A prompt's block keys, chained on from an earlier prompt's: always what chain_keys computes
from scratch, whatever the shared prefix, block size or LoRA."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.gateway.kv_events import chain_keys
from tokenplane.gateway.token_blocks import TokenBlocks

token_lists = st.lists(st.integers(0, 40), max_size=120)


@settings(max_examples=200, deadline=None)
@given(
    prefix=token_lists,
    first_tail=token_lists,
    tail=token_lists,
    sizes=st.lists(st.sampled_from([1, 2, 3, 16]), min_size=1, max_size=3),
    lora=st.sampled_from([None, 7]),
    seed_keyed=st.booleans(),
)
def test_keys_chained_from_a_prefix_equal_keys_from_scratch(
    prefix: list[int],
    first_tail: list[int],
    tail: list[int],
    sizes: list[int],
    lora: int | None,
    seed_keyed: bool,
) -> None:
    first = TokenBlocks(prefix + first_tail)
    if seed_keyed:
        for size in sizes:
            assert first.keys(size, lora) == chain_keys(prefix + first_tail, size, lora)
    ids = prefix + tail
    second = TokenBlocks(ids, first.known, len(prefix))
    for size in sizes:
        assert second.keys(size, lora) == chain_keys(ids, size, lora)
        assert second.keys(size, lora) is second.keys(size, lora)  # hashed once per request
    if seed_keyed:  # only the blocks past the shared prefix were hashed again
        assert second.hashed == sum(len(ids) // s - len(prefix) // s for s in set(sizes))


def test_a_seed_of_another_block_size_or_lora_is_not_used() -> None:
    ids = list(range(64))
    first = TokenBlocks(ids)
    first.keys(16)
    second = TokenBlocks(ids, first.known, len(ids))
    assert second.keys(8) == chain_keys(ids, 8) and second.hashed == 8
    assert second.keys(16, 3) == chain_keys(ids, 16, 3) and second.hashed == 12
    assert second.keys(16) == chain_keys(ids, 16) and second.hashed == 12
