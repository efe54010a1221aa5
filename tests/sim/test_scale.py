"""``bench/sim_speed.py``'s day-of-a-fleet figure, in a small size: the keys the issue names, and a
streamed run that kept no records (its peak memory is its own, measured in a child process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMALL = ("--scale-requests", "3000", "--instances", "16")


def test_sim_speed_scale_figure_has_wall_time_and_peak_memory() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sim_speed.py"), "--json", "--only-scale", *SMALL],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = json.loads(out.stdout)
    fig = doc["synthetic_3000_16"]
    assert fig["requests"] == 3000 and fig["completed"] == 3000
    assert doc["synthetic_3000_16_wall_s"] == fig["wall_s"] > 0
    # a child's own peak: a Python process with the twin loaded, far from the 4 GB target
    assert 20 < doc["synthetic_3000_16_peak_rss_mb"] < 1000
    assert fig["simulated_s"] > 3000 / (10_000_000 / 86_400) * 0.9  # the day's rate: ~26 s of traffic
