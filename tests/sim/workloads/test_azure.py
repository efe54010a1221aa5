from __future__ import annotations

from pathlib import Path

import pytest

from tokenplane.sim.workloads.azure import AzureTrace, parse_azure_timestamp

CSV = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:46.6805901,396,109
2023-11-16 18:15:50.9951690,1000,0
2023-11-16 23:59:59.5000000,10,1
2023-11-17 00:00:00.2500000,20,2
"""


def _write(tmp_path: Path, text: str = CSV) -> Path:
    path = tmp_path / "azure.csv"
    path.write_text(text)
    return path


def test_parse_seven_fractional_digits() -> None:
    secs, frac = parse_azure_timestamp("2023-11-16 18:15:46.6805900")
    assert frac == pytest.approx(0.68059)
    secs2, frac2 = parse_azure_timestamp("2023-11-16 18:15:46.6805901")
    assert secs2 == secs
    assert (frac2 - frac) == pytest.approx(1e-7, abs=1e-12)
    assert parse_azure_timestamp("2023-11-16 18:15:47")[1] == 0.0


def test_arrivals_relative_to_first_row(tmp_path: Path) -> None:
    specs = list(AzureTrace(_write(tmp_path)).arrivals())
    assert [s.request_id for s in specs] == [0, 1, 2, 3, 4]
    assert specs[0].arrival_s == 0.0
    assert specs[1].arrival_s == pytest.approx(1e-7, abs=1e-9)
    assert specs[2].arrival_s == pytest.approx(50.9951690 - 46.6805900)
    # Crossing midnight.
    assert specs[4].arrival_s - specs[3].arrival_s == pytest.approx(0.75)
    assert [s.prompt_tokens for s in specs] == [374, 396, 1000, 10, 20]
    assert [s.output_tokens for s in specs] == [44, 109, 1, 1, 2]
    assert all(s.block_hashes == () and s.max_output_tokens == s.output_tokens for s in specs)


def test_time_scale_and_limit(tmp_path: Path) -> None:
    path = _write(tmp_path)
    base = list(AzureTrace(path).arrivals())
    fast = list(AzureTrace(path, time_scale=0.5).arrivals())
    assert [f.arrival_s for f in fast] == pytest.approx([b.arrival_s * 0.5 for b in base])
    assert len(list(AzureTrace(path, limit=3).arrivals())) == 3


def test_bad_header_and_disorder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="header"):
        list(AzureTrace(_write(tmp_path, "a,b,c\n1,2,3\n")).arrivals())
    disorder = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:47.0,1,1\n2023-11-16 18:15:46.0,1,1\n"
    )
    with pytest.raises(ValueError, match="back in time"):
        list(AzureTrace(_write(tmp_path, disorder)).arrivals())
