"""The ``discovery:`` section: the README's example loads; a source missing its settings is refused
with its path; pods' ``tokenplane.io/`` metadata maps to the instance the README describes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tokenplane.gateway import ConfigError, parse_config
from tokenplane.gateway.discovery.kubernetes import instance_of

README = (Path(__file__).resolve().parents[3] / "README.md").read_text()
BASE: dict[str, Any] = {"models": [{"name": "llama-3-8b"}]}


def test_the_readme_example_loads_with_no_static_instances() -> None:
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", README, flags=re.S) if "discovery:" in b)
    cfg = parse_config({**BASE, **yaml.safe_load(block)})
    assert cfg.discovery.kind == "kubernetes" and cfg.instances == ()
    assert cfg.discovery.kubernetes is not None and cfg.discovery.kubernetes.namespace == "inference"
    assert cfg.reload.watch and cfg.drain.deadline_s == 110


@pytest.mark.parametrize(
    ("section", "where"),
    [
        ({"kind": "kubernetes"}, "discovery"),
        ({"kind": "file"}, "discovery"),
        ({"kind": "kubernetes", "kubernetes": {"namespace": "x"}}, "discovery.kubernetes.label_selector"),
        ({"kind": "dns"}, "discovery.kind"),
    ],
)
def test_an_incomplete_source_is_refused_with_its_path(section: dict[str, Any], where: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(where)):
        parse_config(
            {
                **BASE,
                "discovery": section,
                "instances": [{"id": "a", "url": "http://a:1", "model": "llama-3-8b"}],
            }
        )


def test_static_still_needs_an_instance() -> None:
    with pytest.raises(ConfigError, match="instances"):
        parse_config(BASE)


def _pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "vllm-7",
            "labels": {"tokenplane.io/model": "llama-3-8b"},
            "annotations": {
                "tokenplane.io/gpu": "L4",
                "tokenplane.io/price-per-hour": "0.8",
                "tokenplane.io/kind": "sglang",
                "tokenplane.io/max-concurrency": "16",
            },
        },
        "spec": {
            "containers": [
                {
                    "ports": [
                        {"name": "metrics", "containerPort": 9000},
                        {"name": "http", "containerPort": 8000},
                    ]
                }
            ]
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.7",
            "conditions": [{"type": "Ready", "status": "True"}],
            **status,
        },
    }


def test_a_ready_pod_becomes_the_instance_its_metadata_describes() -> None:
    inst = instance_of(_pod(), "http")
    assert inst is not None
    assert (inst.id, inst.url, inst.model, inst.kind.value) == (
        "vllm-7",
        "http://10.0.0.7:8000",
        "llama-3-8b",
        "sglang",
    )
    assert (inst.gpu, inst.price_per_hour, inst.max_concurrency) == ("L4", 0.8, 16)
    pod = _pod()
    pod["metadata"]["annotations"]["tokenplane.io/port"] = "8100"
    assert instance_of(pod, "http").url == "http://10.0.0.7:8100"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "change",
    [
        {"conditions": [{"type": "Ready", "status": "False"}]},
        {"phase": "Pending"},
        {"podIP": None},
    ],
)
def test_an_unready_pod_is_not_served(change: dict[str, Any]) -> None:
    assert instance_of(_pod(**change), "http") is None


def test_a_terminating_or_unlabelled_or_invalid_pod_is_not_served() -> None:
    pod = _pod()
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert instance_of(pod, "http") is None
    pod = _pod()
    del pod["metadata"]["labels"]["tokenplane.io/model"]
    assert instance_of(pod, "http") is None
    pod = _pod()
    pod["metadata"]["annotations"]["tokenplane.io/price-per-hour"] = "cheap"
    assert instance_of(pod, "http") is None
