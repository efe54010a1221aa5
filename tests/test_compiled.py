"""The compiled build (``setup.py``, ``scripts/build-compiled.sh``): what it compiles, and that a
test run meant for it runs against it.

CI builds ``.venv-compiled`` and runs the test suite (less the real-vLLM tests) with its
interpreter and ``TOKENPLANE_EXPECT_COMPILED=1``; the check below then fails if those tests
imported the pure modules instead (a source tree ahead on ``sys.path``, a build that compiled
nothing), so a green run of them means the compiled code passed.
"""

from __future__ import annotations

import ast
import importlib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _compiled_modules() -> list[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "COMPILED_MODULES":
            paths = ast.literal_eval(node.value)
            return [p.removesuffix(".py").replace("/", ".") for p in paths]
    raise AssertionError("setup.py names no COMPILED_MODULES")


def test_every_compiled_module_exists_and_imports() -> None:
    modules = _compiled_modules()
    assert "tokenplane.gateway.app" in modules
    for name in modules:
        assert importlib.import_module(name) is not None


@pytest.mark.skipif(
    os.environ.get("TOKENPLANE_EXPECT_COMPILED") != "1",
    reason="runs against the compiled build (TOKENPLANE_EXPECT_COMPILED=1, .venv-compiled)",
)
def test_the_run_imports_the_compiled_modules() -> None:
    pure = [
        name
        for name in _compiled_modules()
        if not (importlib.import_module(name).__file__ or "").endswith(".so")
    ]
    assert not pure, f"imported as Python source, not compiled: {pure}"
