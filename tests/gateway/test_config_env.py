"""``${NAME}`` in a gateway config is filled from the environment; an unset one refuses the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenplane.gateway.config import ConfigError, hash_key, load_config
from tokenplane.gateway.config_env import expand_env

CONFIG = """
listen: {host: 127.0.0.1, port: 0}
tenants:
  - {name: acme, api_keys: ["${ACME_KEY_HASH}"]}
models:
  - {name: m, aliases: ["${ALIAS}-x", "$${LITERAL}"]}
instances:
  - {id: i0, url: "http://${UPSTREAM_HOST}:8001", model: m}
"""


def test_variables_are_filled_and_escapes_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    digest = hash_key("sk-secret")
    monkeypatch.setenv("ACME_KEY_HASH", digest)
    monkeypatch.setenv("ALIAS", "chat")
    monkeypatch.setenv("UPSTREAM_HOST", "10.0.0.7")
    f = tmp_path / "gw.yaml"
    f.write_text(CONFIG)
    cfg = load_config(f)
    assert cfg.tenants[0].api_keys == (digest,)
    assert cfg.models[0].aliases == ("chat-x", "${LITERAL}")
    assert cfg.instances[0].url == "http://10.0.0.7:8001"


def test_an_unset_variable_is_refused_naming_it_and_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALIAS", "chat")
    monkeypatch.delenv("ACME_KEY_HASH", raising=False)
    monkeypatch.delenv("UPSTREAM_HOST", raising=False)
    f = tmp_path / "gw.yaml"
    f.write_text(CONFIG)
    with pytest.raises(ConfigError) as err:
        load_config(f)
    msg = str(err.value)
    assert "tenants[0].api_keys[0]: ACME_KEY_HASH" in msg
    assert "instances[0].url: UPSTREAM_HOST" in msg


def test_keys_and_non_strings_are_left_alone() -> None:
    raw = {"${K}": 1, "n": 2, "s": ["a${V}b", 3.5, None]}
    out, unset = expand_env(raw, {"V": "-"})
    assert out == {"${K}": 1, "n": 2, "s": ["a-b", 3.5, None]}
    assert unset == []
