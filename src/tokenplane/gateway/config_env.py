"""``${NAME}`` in a gateway config file, filled from the environment when the file is loaded.

So that secrets (API key hashes, Redis and PostgreSQL URLs) can come from a Kubernetes Secret or a
systemd credential while the rest of the config sits in a ConfigMap. Only string values are expanded
(never keys); ``$${`` writes a literal ``${``. The loader refuses a config that names an unset
variable, listing each and where it is used: a gateway never starts with an empty key or URL in
place of a secret.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_REF = re.compile(r"\$(\$?)\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_env(raw: Any, environ: Mapping[str, str]) -> tuple[Any, list[str]]:
    """A copy of ``raw`` (as loaded from YAML) with every ``${NAME}`` in its strings replaced, and
    the unset references as ``"path.to.field: NAME"`` (empty when every variable is set)."""
    unset: list[str] = []
    return _expand(raw, environ, "", unset), unset


def _expand(value: Any, environ: Mapping[str, str], where: str, unset: list[str]) -> Any:
    if isinstance(value, str):
        return _expand_str(value, environ, where, unset)
    if isinstance(value, Mapping):
        return {k: _expand(v, environ, f"{where}.{k}" if where else str(k), unset) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, environ, f"{where}[{i}]", unset) for i, v in enumerate(value)]
    return value


def _expand_str(text: str, environ: Mapping[str, str], where: str, unset: list[str]) -> str:
    if "${" not in text:
        return text

    def sub(m: re.Match[str]) -> str:
        name = m.group(2)
        if m.group(1):  # $${NAME}: a literal ${NAME}
            return "${" + name + "}"
        if name not in environ:
            unset.append(f"{where or '<root>'}: {name}")
            return ""
        return environ[name]

    return _REF.sub(sub, text)
