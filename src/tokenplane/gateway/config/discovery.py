"""Where instances come from: the config file, another file, or Kubernetes pods."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tokenplane.gateway.config.base import Strict


class KubernetesDiscoveryConfig(Strict):
    """Ready pods in ``namespace`` matching ``label_selector`` (gateway/discovery/kubernetes.py)."""

    namespace: str = Field(min_length=1)
    label_selector: str = Field(min_length=1)
    port_name: str = "http"
    api_host: str | None = None
    """A bare API server URL (a proxy, tests); else in-cluster or the kubeconfig."""
    in_cluster: bool = True
    kubeconfig: str | None = None
    watch_timeout_s: float = Field(60.0, ge=1)
    backoff_s: float = Field(0.5, gt=0)
    backoff_max_s: float = Field(10.0, gt=0)


class DiscoveryConfig(Strict):
    """Where instances come from: ``static`` (``instances``, fixed), ``file`` (``path``'s
    ``instances``, re-read on change), ``kubernetes`` (ready pods)."""

    kind: Literal["static", "file", "kubernetes"] = "static"
    path: str | None = None
    interval_s: float = Field(1.0, gt=0)
    drain_timeout_s: float = Field(110.0, gt=0)
    """A leaving instance is removed once its requests end, or after this long."""
    kubernetes: KubernetesDiscoveryConfig | None = None

    @model_validator(mode="after")
    def _source(self) -> DiscoveryConfig:
        if self.kind == "file" and not self.path:
            raise ValueError("path: required with kind: file")
        if self.kind == "kubernetes" and self.kubernetes is None:
            raise ValueError("kubernetes: required with kind: kubernetes (namespace, label_selector)")
        return self
