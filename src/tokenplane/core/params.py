"""Explicit validation of policy params: unknown keys, wrong types and out-of-range values fail loudly.

Every factory of a core policy reads its params through a :class:`ParamReader`, so a typo in a YAML
file (``cache_treshold``) or a negative threshold is an :class:`InvalidPolicyConfig` at start-up that
names the policy, the key and the reason, never a silently ignored setting. (``core/routing/_params.py``
holds the routing plugins' copy of the same reader.)
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

from tokenplane.core.errors import InvalidPolicyConfig


class ParamReader:
    """Typed getters over one plugin's params; construction rejects keys outside ``allowed``."""

    def __init__(self, owner: str, params: Mapping[str, Any], allowed: Collection[str]) -> None:
        if not isinstance(params, Mapping):
            raise InvalidPolicyConfig(f"{owner}: params must be a mapping, got {type(params).__name__}")
        unknown = sorted(str(k) for k in params if k not in allowed)
        if unknown:
            known = ", ".join(sorted(allowed)) or "none"
            raise InvalidPolicyConfig(f"{owner}: unknown params {unknown}; known: {known}")
        self.owner = owner
        self._params = params

    def has(self, key: str) -> bool:
        return key in self._params

    def raw(self, key: str, default: Any = None) -> Any:
        return self._params.get(key, default)

    def _fail(self, key: str, why: str) -> InvalidPolicyConfig:
        return InvalidPolicyConfig(f"{self.owner}: param {key!r} {why}, got {self._params.get(key)!r}")

    def float_(
        self,
        key: str,
        default: float,
        *,
        min_value: float | None = None,
        max_value: float | None = None,
        exclusive_min: bool = False,
    ) -> float:
        value = self._params.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._fail(key, "must be a number")
        result = float(value)
        if math.isnan(result):
            raise self._fail(key, "must not be NaN")
        if min_value is not None:
            if exclusive_min and not result > min_value:
                raise self._fail(key, f"must be > {min_value}")
            if not exclusive_min and result < min_value:
                raise self._fail(key, f"must be >= {min_value}")
        if max_value is not None and result > max_value:
            raise self._fail(key, f"must be <= {max_value}")
        return result

    def int_(self, key: str, default: int, *, min_value: int | None = None) -> int:
        value = self._params.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(key, "must be an integer")
        if min_value is not None and value < min_value:
            raise self._fail(key, f"must be >= {min_value}")
        return value

    def choice(self, key: str, default: str, choices: Collection[str]) -> str:
        value = self._params.get(key, default)
        if not isinstance(value, str) or value not in choices:
            raise self._fail(key, f"must be one of {sorted(choices)}")
        return value

    def bool_(self, key: str, default: bool) -> bool:
        value = self._params.get(key, default)
        if not isinstance(value, bool):
            raise self._fail(key, "must be true or false")
        return value


def no_params(owner: str, params: Mapping[str, Any]) -> None:
    """For plugins that take no params: any key is an error."""
    ParamReader(owner, params, ())
