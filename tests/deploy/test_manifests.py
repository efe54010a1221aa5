"""Every manifest under deploy/kubernetes/ is valid Kubernetes 1.30+, and what it mounts is a config
the gateway loads."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from manifests import BASE, DEPLOY, base_resource, kustomizations, resources

kv = pytest.importorskip("kubernetes_validate.utils", reason="kubernetes-validate is a dev dependency")

K8S_VERSIONS = ("1.30.0", "1.37.0")  # the oldest we support and the newest schemas we have


def _core_documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for k in kustomizations():
        for doc in resources(k):
            if not doc["apiVersion"].startswith("monitoring.coreos.com/"):
                out.append((f"{k.parent.relative_to(DEPLOY)}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return out


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("where", "doc"), _core_documents(), ids=[w for w, _ in _core_documents()])
def test_manifest_validates_against_the_kubernetes_schema(
    where: str, doc: dict[str, Any], version: str
) -> None:
    kv.validate(doc, version, strict=True)  # raises ValidationError naming the field


def test_a_broken_manifest_is_caught() -> None:
    dep = json.loads(json.dumps(base_resource("Deployment")))
    dep["spec"]["replicas"] = "three"
    with pytest.raises(kv.ValidationError):
        kv.validate(dep, K8S_VERSIONS[0], strict=True)


def test_every_file_in_the_base_is_listed_and_every_listed_file_exists() -> None:
    spec = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    listed = set(spec["resources"]) | {f for g in spec["configMapGenerator"] for f in g["files"]}
    present = {str(p.relative_to(BASE)) for p in BASE.rglob("*") if p.is_file()} - {"kustomization.yaml"}
    assert listed == present


def test_service_monitor_selects_the_service_and_scrapes_metrics() -> None:
    """The ServiceMonitor is a CRD (no schema in kubernetes-validate): check what Prometheus needs."""
    sm = base_resource("ServiceMonitor")
    svc = base_resource("Service")
    selector = sm["spec"]["selector"]["matchLabels"]
    assert selector.items() <= svc["metadata"]["labels"].items()
    port_names = {p["name"] for p in svc["spec"]["ports"]}
    assert [(e["port"], e["path"]) for e in sm["spec"]["endpoints"]] == [("http", "/metrics")]
    assert sm["spec"]["endpoints"][0]["port"] in port_names


def test_selectors_match_the_pods() -> None:
    pod_labels = base_resource("Deployment")["spec"]["template"]["metadata"]["labels"]
    for kind in ("Deployment", "PodDisruptionBudget"):
        assert base_resource(kind)["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert base_resource("Service")["spec"]["selector"].items() <= pod_labels.items()


def test_probes_and_drain_use_the_gateway_health_route() -> None:
    container = base_resource("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert container["resources"]["requests"]["cpu"]


def test_the_mounted_config_loads_with_the_secret_as_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokenplane.gateway.config import load_config

    cm = base_resource("ConfigMap", "tokenplane-gateway")
    dep = base_resource("Deployment")
    container = dep["spec"]["template"]["spec"]["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    path = Path(container["args"][-1])
    assert str(path.parent) == mount["mountPath"] and path.name in cm["data"]
    secret = base_resource("Secret")
    assert [e["secretRef"]["name"] for e in container["envFrom"]] == [secret["metadata"]["name"]]
    for name, value in secret["stringData"].items():
        monkeypatch.setenv(name, value)
    f = tmp_path / path.name
    f.write_text(cm["data"][path.name])
    cfg = load_config(f)
    assert cfg.tenants[0].api_keys == (secret["stringData"]["TOKENPLANE_DEFAULT_KEY_HASH"],)
    assert cfg.listen.port == container["ports"][0]["containerPort"]
    grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert cfg.drain.deadline_s < grace, "SIGTERM's drain ends before the kubelet's SIGKILL"


def test_the_dashboard_configmap_carries_the_dashboard() -> None:
    cm = base_resource("ConfigMap", "tokenplane-dashboard")
    assert cm["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert json.loads(cm["data"]["tokenplane-dashboard.json"])["panels"]
