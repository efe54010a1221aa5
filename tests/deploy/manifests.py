"""Reading the Kubernetes package under deploy/kubernetes/ the way kustomize would (for the tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
BASE = DEPLOY / "base"


def kustomizations() -> list[Path]:
    return sorted(DEPLOY.rglob("kustomization.yaml"))


def resources(kustomization: Path) -> list[dict[str, Any]]:
    """The documents a kustomization lists (recursively through bases), plus its generated ConfigMaps."""
    spec = yaml.safe_load(kustomization.read_text())
    out: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = (kustomization.parent / entry).resolve()
        if path.is_dir():
            out.extend(resources(path / "kustomization.yaml"))
        else:
            out.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    for gen in spec.get("configMapGenerator", []):
        data = {Path(f).name: (kustomization.parent / f).read_text() for f in gen.get("files", [])}
        labels = gen.get("options", {}).get("labels", {})
        out.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": gen["name"], "labels": labels},
                "data": data,
            }
        )
    return out


def base_resource(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d
        for d in resources(BASE / "kustomization.yaml")
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]
