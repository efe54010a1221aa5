"""The core decides; it does no I/O and reads no clocks. Walk its imports to keep it so."""

from __future__ import annotations

import ast
from pathlib import Path

import tokenplane.core

FORBIDDEN = {
    "asyncio",
    "aiohttp",
    "httpx",
    "socket",
    "time",
    "threading",
    "subprocess",
    "requests",
    "os",
    "pathlib",
    "datetime",
}
FORBIDDEN_PREFIXES = ("tokenplane.sim", "tokenplane.gateway", "tokenplane.emulator", "tokenplane.cli")


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_core_imports_no_io_clock_or_shell_modules() -> None:
    root = Path(tokenplane.core.__file__).parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        for name in _imports(path):
            top = name.split(".")[0]
            if top in FORBIDDEN or name.startswith(FORBIDDEN_PREFIXES):
                bad.append(f"{path.relative_to(root)}: {name}")
    assert not bad, "core must stay pure:\n" + "\n".join(bad)


def test_core_uses_no_global_random() -> None:
    root = Path(tokenplane.core.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "random"
                and node.func.attr != "Random"
            ):
                offenders.append(f"{path.relative_to(root)}:{node.lineno} random.{node.func.attr}()")
    assert not offenders, "use an injected random.Random:\n" + "\n".join(offenders)
