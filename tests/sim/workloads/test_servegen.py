from __future__ import annotations

import json
import statistics
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest

from tokenplane.sim.workloads.servegen import ServeGenWorkload, load_servegen_client


def _client(folder: Path, n: int, rows: list[str], data: dict[str, dict[str, str]]) -> None:
    (folder / f"chunk-{n}-trace.csv").write_text("\n".join(rows) + "\n")
    (folder / f"chunk-{n}-dataset.json").write_text(json.dumps(data))


PMF_A = {"input_tokens": "{100: 0.5, 300: 0.5}", "output_tokens": "{10: 1.0}", "reason_ratio": "{0.0: 1.0}"}
PMF_B = {"input_tokens": "{1000: 1.0}", "output_tokens": "{50: 0.25, 70: 0.75}", "reason_ratio": "{}"}
EMPTY = {"input_tokens": "{}", "output_tokens": "{}", "reason_ratio": "{}"}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    # Client 0: 2 req/s gamma in window 0, nothing in window 1, 1 req/s Weibull in window 2.
    _client(
        tmp_path,
        0,
        ["0,2.0,2.0,Gamma,0.25,2.0", "600,0,0,,0,0", "1200,1.0,0.5,Weibull,2.1,1.1"],
        {"0": PMF_A, "1200": PMF_B},
    )
    # Client 3: Poisson-like 0.5 req/s everywhere, PMFs only in a later window (nearest is used).
    _client(
        tmp_path,
        3,
        ["0,0.5,1.0,,0,0", "600,0.5,1.0,,0,0", "1200,0.5,1.0,,0,0"],
        {"0": EMPTY, "1200": PMF_B},
    )
    return tmp_path


def test_load_client_model(folder: Path) -> None:
    cm = load_servegen_client(folder, 0)
    assert [w.start_s for w in cm.windows] == [0.0, 1200.0]
    assert cm.windows[0].end_s == 600.0 and cm.windows[1].end_s == 1800.0
    assert cm.dataset_starts == (0.0, 1200.0)
    assert cm.pmf_index_at(100.0) == 0 and cm.pmf_index_at(1500.0) == 1
    assert load_servegen_client(folder, 3).pmf_index_at(10.0) == 1


def test_arrivals_rates_lengths_and_tenants(folder: Path) -> None:
    specs = list(ServeGenWorkload(folder, seed=1).arrivals())
    assert [s.request_id for s in specs] == list(range(len(specs)))
    assert all(a.arrival_s <= b.arrival_s for a, b in pairwise(specs))
    c0 = [s for s in specs if s.tenant == "client-0"]
    c3 = [s for s in specs if s.tenant == "client-3"]
    assert {s.tenant for s in specs} == {"client-0", "client-3"}
    w0 = [s for s in c0 if s.arrival_s < 600]
    assert not [s for s in c0 if 600 <= s.arrival_s < 1200]
    w2 = [s for s in c0 if s.arrival_s >= 1200]
    assert len(w0) == pytest.approx(1200, rel=0.2)
    assert len(w2) == pytest.approx(600, rel=0.15)
    assert len(c3) == pytest.approx(900, rel=0.15)
    assert {s.prompt_tokens for s in w0} == {100, 300}
    assert {s.output_tokens for s in w0} == {10}
    assert {s.prompt_tokens for s in w2} == {1000}
    assert Counter(s.output_tokens for s in w2)[70] > Counter(s.output_tokens for s in w2)[50]
    assert {s.prompt_tokens for s in c3} == {1000}
    assert all(s.max_output_tokens == s.output_tokens and s.block_hashes == () for s in specs)
    # Weibull window: gaps have roughly the window's cv.
    gaps = [b.arrival_s - a.arrival_s for a, b in pairwise(w2)]
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(0.5, rel=0.25)


def test_clients_time_scale_duration_and_determinism(folder: Path) -> None:
    full = list(ServeGenWorkload(folder, seed=2).arrivals())
    assert full == list(ServeGenWorkload(folder, seed=2).arrivals())
    assert full != list(ServeGenWorkload(folder, seed=3).arrivals())
    only0 = list(ServeGenWorkload(folder, clients=[0], seed=2).arrivals())
    assert {s.tenant for s in only0} == {"client-0"}
    # A client's requests do not depend on which other clients are present.
    assert [(s.arrival_s, s.prompt_tokens) for s in only0] == [
        (s.arrival_s, s.prompt_tokens) for s in full if s.tenant == "client-0"
    ]
    fast = list(ServeGenWorkload(folder, clients=[0], seed=2, time_scale=0.1).arrivals())
    assert [s.arrival_s for s in fast] == pytest.approx([s.arrival_s * 0.1 for s in only0])
    cut = list(ServeGenWorkload(folder, seed=2, duration_s=300).arrivals())
    assert cut and cut[-1].arrival_s <= 300
    assert cut == full[: len(cut)]
    with pytest.raises(FileNotFoundError, match=r"\[7\]"):
        ServeGenWorkload(folder, clients=[7])
    with pytest.raises(FileNotFoundError):
        ServeGenWorkload(folder / "missing")
