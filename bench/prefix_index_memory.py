"""Memory of the approximate prefix index (``core/routing/prefix_index.py``) at the soak's bound.

The gateway's :class:`PrefixIndex` is bounded per instance by its engine's KV cache size in blocks
(``Gateway.bound_prefix_indexes``); at the soak's (3 instances x 28,386 blocks, an emulated H100) it
is the gateway's largest structure that grows with traffic. This fills one such index with soak-like
prompts (the soak's system message, a step number and 20-120 random words, rendered and hashed as
the gateway does, in its routing blocks), routed at random over the instances, and reports its cost
per engine KV block (16 tokens; the figure issue 17's RSS budget is in) and per block of its own
bound: once full (the first time the blocks held reach
``--full-share`` of the bound) and after ``--prompts`` prompts (churned: its tables have been
resized and its entries replaced many times). Two figures each: ``tracemalloc`` (Python objects
only, exact) and the process's RSS growth (what the soak's ``rss_growth_pct`` sees), each measured
in its own child process so that tracemalloc's bookkeeping does not inflate the RSS.

``--baseline-src`` runs the same against another checkout's ``src``, side by side::

    nice -n 15 python bench/prefix_index_memory.py --baseline-src /work/main/src
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the soak's vocabulary (bench/soak.py)
_TEXT = "tensor kernel batch cache token prefix route queue shard replica latency budget agent tool "
_TEXT += "search plan patch test review deploy metric trace window scheduler decode prefill"
WORDS = _TEXT.split(" ")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(a: argparse.Namespace, mode: str) -> dict[str, float]:
    import random
    import tracemalloc

    from tokenplane.core.prompt_hash import DEFAULT_BLOCK_TOKENS, block_hashes, render_chat

    try:  # the gateway's block for this index, where the checkout has one
        from tokenplane.core.prompt_hash import ROUTING_BLOCK_TOKENS as block_tokens
    except ImportError:
        block_tokens = DEFAULT_BLOCK_TOKENS
    if a.block_tokens:
        block_tokens = a.block_tokens
    from tokenplane.core.routing.prefix_index import PrefixIndex
    from tokenplane.runloop import fix_mmap_threshold

    fix_mmap_threshold()  # as the gateway does
    rng = random.Random(a.seed)
    ids = [f"i{k}" for k in range(a.instances)]
    idx = PrefixIndex()
    bound = -(-a.kv_capacity_tokens // block_tokens)  # as Gateway.bound_prefix_indexes sets it
    for iid in ids:
        idx.set_bound(iid, bound)
    total = bound * len(ids)
    kv_blocks = -(-a.kv_capacity_tokens // DEFAULT_BLOCK_TOKENS) * len(ids)  # the engines' own
    prompts = []
    for _ in range(2000):  # hashed once: the loop below measures the index, not the hashing
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))
        step = rng.randint(1, 5)
        text = render_chat(
            [
                {"role": "system", "content": "You are a careful agent."},
                {"role": "user", "content": f"step {step}: {prompt}"},
            ]
        )
        prompts.append(block_hashes(text, block_tokens))
    # Fill CPython's tuple free lists (2,000 a size) first: the chains' tuples would otherwise stay
    # allocated in them and count as ~20 bytes a block in both checkouts.
    spare = [tuple(range(k)) for k in range(1, 40) for _ in range(2000)]
    del spare
    if mode == "tracemalloc":
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
    else:
        base = _rss()
    full = None
    for n in range(a.prompts):
        # fresh hashes per prompt (a salt in the first link), so the index keeps filling
        chain = prompts[n % len(prompts)]
        salt = n // len(prompts) if rng.random() < 0.9 else n  # some prompts repeat, most are new
        chain = tuple(h ^ (salt * 0x9E3779B97F4A7C15 & (2**63 - 1)) for h in chain)
        idx.insert(rng.choice(ids), chain, now=float(n))
        if full is None and sum(idx.blocks_held(i) for i in ids) >= a.full_share * total:
            full = (tracemalloc.get_traced_memory()[0] if mode == "tracemalloc" else _rss()) - base
            full_at = n
    end = (tracemalloc.get_traced_memory()[0] if mode == "tracemalloc" else _rss()) - base
    return {
        "block_tokens": float(block_tokens),
        "bound_blocks": total,
        "full_at_prompt": float(full_at) if full is not None else -1.0,
        "full_B_per_kv_block": (full or 0) / kv_blocks,
        "churned_B_per_kv_block": end / kv_blocks,
        "churned_B_per_index_block": end / total,
        "held_share_end": sum(idx.blocks_held(i) for i in ids) / total,
        "distinct_blocks_end": float(len(idx)),
    }


def run(src: Path, a: argparse.Namespace) -> dict[str, dict[str, float]]:
    out = {}
    for mode in ("tracemalloc", "rss"):
        cmd = [sys.executable, __file__, "--child", mode, *_args(a)]
        env = {**os.environ, "PYTHONPATH": str(src)}
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        out[mode] = json.loads(res.stdout)
    return out


def _args(a: argparse.Namespace) -> list[str]:
    return [
        f"--instances={a.instances}",
        f"--kv-capacity-tokens={a.kv_capacity_tokens}",
        f"--prompts={a.prompts}",
        f"--seed={a.seed}",
        f"--full-share={a.full_share}",
        f"--block-tokens={a.block_tokens}",
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--kv-capacity-tokens", type=int, default=28_386 * 16, help="per instance")
    p.add_argument("--prompts", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--full-share", type=float, default=0.5, help="of the bound: counts as full")
    p.add_argument("--block-tokens", type=int, default=0, help="instead of the gateway's routing block")
    p.add_argument("--baseline-src", type=Path, help="another checkout's src, measured too")
    p.add_argument("--child", choices=["tracemalloc", "rss"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a, a.child)))
        return
    result = {"this": run(ROOT / "src", a)}
    if a.baseline_src is not None:
        result["baseline"] = run(a.baseline_src, a)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
