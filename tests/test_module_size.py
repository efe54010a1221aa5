"""Issue 13's size rule (``tests/gateway/test_module_size.py``) for the core and the twin too: no
module of ``core/`` or ``sim/`` over 450 lines; split a growing one by concept, as
``core/admission_backlog.py`` and ``sim/fleet_settings.py`` were split out."""

from __future__ import annotations

from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "tokenplane"
MAX_LINES = 450


@pytest.mark.parametrize("package", ["core", "sim"])
def test_no_module_is_over_the_limit(package: str) -> None:
    root = PACKAGE / package
    over = {
        str(p.relative_to(root)): n
        for p in root.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert list(root.rglob("*.py")), f"no modules under {root}"
    assert not over, f"{package}/ modules over {MAX_LINES} lines: {over}"
