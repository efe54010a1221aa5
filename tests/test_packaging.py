"""The README's first command installs the package without extras and runs ``tokenplane up``: every
module the main job imports must come from the base dependencies."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _names(specs: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", s, maxsplit=1)[0].lower() for s in specs}


def test_main_job_imports_come_from_the_base_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = _names(project["dependencies"])
    demo = (ROOT / "src" / "tokenplane" / "demo.py").read_text()
    imported = set(re.findall(r"^\s*import (openai|aiohttp|rich)\b", demo, flags=re.M))
    assert "openai" in imported  # the main job's users are the official client
    assert imported <= base
