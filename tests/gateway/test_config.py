"""The config file: validated once, every failure naming its field."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tokenplane.gateway import ConfigError, hash_key, load_config
from tokenplane.gateway.config import PRIORITY_VALUES

GOOD = f"""
listen: {{host: 127.0.0.1, port: 8080}}
limits: {{max_body_bytes: 1048576, max_tokens: 32768, max_prompt_tokens: 131072, upstream_timeout_s: 300}}
tenants:
  - {{name: acme, priority: interactive, api_keys: ["{hash_key("sk-acme")}"], max_concurrency: 64}}
models:
  - {{name: llama-3-8b, aliases: [llama3, gpt-4o-mini], router: {{name: prefix-affinity}},
     upstream_model: null}}
instances:
  - {{id: vllm-0, url: http://127.0.0.1:8001/, model: llama-3-8b, kind: vllm, gpu: H100, price_per_hour: 2.99,
     labels: {{}}}}
scrape: {{interval_s: 1.0}}
health: {{interval_s: 2.0, failures_to_down: 2, path: /health}}
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "gw.yaml"
    p.write_text(text)
    return p


def test_hash_key() -> None:
    assert hash_key("sk-acme") == "sha256:" + hashlib.sha256(b"sk-acme").hexdigest()


def test_load_good_config(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, GOOD))
    assert cfg.instances[0].url == "http://127.0.0.1:8001"
    assert cfg.models[0].served_name == "llama-3-8b"
    assert cfg.tenants[0].priority == "interactive" and PRIORITY_VALUES["interactive"] > 0
    assert cfg.auth_enabled


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("port: 8080", "port: 99999", "listen.port"),
        ("max_tokens: 32768", "max_tokens: 0", "limits.max_tokens"),
        ("priority: interactive", "priority: urgent", "tenants[0].priority"),
        (f'["{hash_key("sk-acme")}"]', '["sk-acme"]', "tenants[0].api_keys"),
        ("kind: vllm", "kind: tgi", "instances[0].kind"),
        ("url: http://127.0.0.1:8001/", "url: 127.0.0.1:8001", "instances[0].url"),
        ("model: llama-3-8b, kind", "model: llama3, kind", "instances[0].model"),
        ("{name: prefix-affinity}", "{name: nope}", "models[0].router"),
        (
            "{name: prefix-affinity}",
            "{name: prefix-affinity, params: {cache_threshold: 2}}",
            "models[0].router",
        ),
        ("labels: {}", "labels: {}, colour: red", "instances[0].colour"),
        ("aliases: [llama3, gpt-4o-mini]", "aliases: [llama3, llama3]", "models[0]"),
        ("interval_s: 1.0", "interval_s: -1", "scrape.interval_s"),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, old: str, new: str, field: str) -> None:
    assert old in GOOD
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, GOOD.replace(old, new, 1)))
    assert field in str(info.value)
    assert str(tmp_path) in str(info.value)


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "models: [unclosed"))
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(_write(tmp_path, "- 1\n- 2\n"))
