"""The Kubernetes example (deploy/kubernetes/keel.yaml) validates offline against the API schemas, and its
probes and timings agree with `keel serve`: liveness /health, readiness /v1/models, and a termination grace
period that covers preStop plus --shutdown-timeout (or Kubernetes kills a draining replica mid-request)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "keel.yaml"
pytestmark = pytest.mark.skipif(not EXAMPLE.is_file(), reason="not a source checkout")
K8S_VERSION = "1.34.0"  # the schemas kubernetes-validate ships offline; `sleep` preStop hooks need >= 1.30


def _docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]


def _container(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def _flag(args: list[str], name: str) -> str:
    for arg in args:
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"the example does not pass --{name}")


@pytest.mark.parametrize("index", range(3))
def test_documents_validate_offline(index: int) -> None:
    docs = _docs()
    assert len(docs) == 3
    kubernetes_validate.validate(docs[index], K8S_VERSION, strict=True)  # raises on an unknown or wrong field


def test_probes_match_keel_serve() -> None:
    _, c = _container(_docs())
    assert c["args"][0] == "serve"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["startupProbe"]["httpGet"]["path"] == "/health"
    assert "/v1/models" in "".join(c["readinessProbe"]["exec"]["command"])  # behind the key: exec with it
    assert _flag(c["args"], "host") == "0.0.0.0"
    assert {"name": "KEEL_API_KEY"}.items() <= next(e for e in c["env"] if e["name"] == "KEEL_API_KEY").items()


def test_grace_period_covers_prestop_and_drain() -> None:
    pod, c = _container(_docs())
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = float(_flag(c["args"], "shutdown-timeout"))
    grace = pod["terminationGracePeriodSeconds"]
    assert grace >= pre_stop + drain + 5, f"grace {grace} s < preStop {pre_stop} s + --shutdown-timeout {drain} s + 5"
