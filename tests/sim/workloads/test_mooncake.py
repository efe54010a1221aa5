from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenplane.sim.workloads.mooncake import MooncakeTrace


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS: list[dict[str, object]] = [
    {"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]},
    {"timestamp": 0, "input_length": 1024, "output_length": 0, "hash_ids": [0, 3]},
    {"timestamp": 1500, "input_length": 300, "output_length": 7, "hash_ids": [4]},
    {"timestamp": 2500, "input_length": 5000, "output_length": 50, "hash_ids": [0, 1, 5]},
]


def test_parses_records(tmp_path: Path) -> None:
    specs = list(MooncakeTrace(_write(tmp_path / "t.jsonl", ROWS), model="m").arrivals())
    assert [s.request_id for s in specs] == [0, 1, 2, 3]
    assert [s.arrival_s for s in specs] == [0.0, 0.0, 1.5, 2.5]
    assert [s.prompt_tokens for s in specs] == [1100, 1024, 300, 5000]
    assert [s.output_tokens for s in specs] == [10, 1, 7, 50]
    assert all(s.max_output_tokens == s.output_tokens for s in specs)
    assert all(s.hash_block_tokens == 512 and s.model == "m" for s in specs)


def test_only_full_blocks_are_hashed(tmp_path: Path) -> None:
    specs = list(MooncakeTrace(_write(tmp_path / "t.jsonl", ROWS)).arrivals())
    # 1100 tokens: 2 full blocks, the third id is a partial block.
    assert specs[0].block_hashes == (0, 1)
    # 1024 tokens: exactly 2 full blocks.
    assert specs[1].block_hashes == (0, 3)
    # 300 tokens: no full block.
    assert specs[2].block_hashes == ()
    # More tokens than ids: all ids kept.
    assert specs[3].block_hashes == (0, 1, 5)
    for s in specs:
        assert len(s.block_hashes) <= s.prompt_tokens // s.hash_block_tokens


def test_block_tokens_parameter(tmp_path: Path) -> None:
    specs = list(MooncakeTrace(_write(tmp_path / "t.jsonl", ROWS), block_tokens=1024).arrivals())
    assert specs[0].block_hashes == (0,)
    assert specs[0].hash_block_tokens == 1024


def test_time_scale_and_limit(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", ROWS)
    fast = list(MooncakeTrace(path, time_scale=0.5).arrivals())
    assert [s.arrival_s for s in fast] == [0.0, 0.0, 0.75, 1.25]
    assert len(list(MooncakeTrace(path, limit=2).arrivals())) == 2
    assert list(MooncakeTrace(path, limit=0).arrivals()) == []
    with pytest.raises(ValueError):
        MooncakeTrace(path, time_scale=0)


def test_rereadable_and_lazy(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", ROWS)
    trace = MooncakeTrace(path)
    assert list(trace.arrivals()) == list(trace.arrivals())
    it = trace.arrivals()
    assert next(it).request_id == 0
    assert trace.on_finished(next(it), 1.0, True) == ()


def test_out_of_order_and_bad_lines_are_errors(tmp_path: Path) -> None:
    bad = _write(tmp_path / "b.jsonl", [ROWS[2], ROWS[0]])
    with pytest.raises(ValueError, match="back in time"):
        list(MooncakeTrace(bad).arrivals())
    broken = tmp_path / "c.jsonl"
    broken.write_text('{"timestamp": 0}\n')
    with pytest.raises(ValueError, match=r"c\.jsonl:1"):
        list(MooncakeTrace(broken).arrivals())
