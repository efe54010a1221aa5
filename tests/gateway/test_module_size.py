"""Issue 13's size rule: no module of the gateway over 450 lines (split a growing one by concept,
as ``gateway/config/`` was)."""

from __future__ import annotations

from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "src" / "tokenplane" / "gateway"
MAX_LINES = 450


def test_no_gateway_module_is_over_the_limit() -> None:
    over = {
        str(p.relative_to(GATEWAY)): n
        for p in GATEWAY.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not over, f"gateway modules over {MAX_LINES} lines: {over}"
