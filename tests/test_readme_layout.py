"""The README's "Layout" section lists every package of ``src/tokenplane`` (a new package that is not
listed there fails here), and names only folders and files that exist or are being built."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "tokenplane"


def _layout_block() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```\n(.*?)```", section, flags=re.S)
    assert blocks, "the Layout section has no plain code block"
    return blocks[0]


def test_every_package_is_listed() -> None:
    listed = _layout_block()
    packages = sorted(p.parent for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)
    missing = [
        str(p.relative_to(PACKAGE))
        for p in packages
        if not re.search(rf"^\s*{re.escape(p.name)}/\s", listed, flags=re.M)
    ]
    assert not missing, f"README's Layout section does not list: {missing}"


def test_the_top_level_folders_it_names_exist() -> None:
    for name in re.findall(r"^(\w[\w.-]*)/", _layout_block(), flags=re.M):
        assert (ROOT / name).is_dir() or (PACKAGE.parent / name).is_dir(), name
