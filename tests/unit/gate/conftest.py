"""The reboot gate's unit tests: its cluster on fake_apiserver.py, for faults only.

The gate's decisions are tested against the session's real kube-apiserver
(tests/integration/cluster/test_gate_*.py, on the same tests/shared/gate_cluster.py). Here the
API server is fake_apiserver.py, for what a real one cannot be made to do: answer a chosen
request with an error, change an object between the gate's read and its write, or serve a
hostile body.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_apiserver import FakeAPIServer
from gate_cluster import CURRENT, KERNELS, NAMESPACE, STAGED, GateCluster
from gate_manifests import DEPLOY, manifests
from oci_registry import OCIRegistry

__all__ = ["CURRENT", "DEPLOY", "KERNELS", "NAMESPACE", "STAGED", "TOKEN", "Cluster"]

TOKEN = "gate-service-account-token"  # noqa: S105 - a test's, sent to the fake API server
Cluster = GateCluster


def rbac_rules(*folders: str) -> list[dict[str, Any]]:
    """The PolicyRules the manifests grant the gate's service account (Roles: with namespace):
    those of what ``kubectl apply -k`` installs from each folder (fluo and kured: common's too),
    each file once."""
    rules: list[dict[str, Any]] = []
    files = [path for folder in folders for path in manifests(DEPLOY / folder)]
    for path in dict.fromkeys(files):
        document = yaml.safe_load(path.read_text())
        if document["kind"] in {"Role", "ClusterRole"}:
            namespace = document["metadata"].get("namespace", "")
            rules += [{**rule, "namespace": namespace} for rule in document["rules"]]
    return rules


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with FakeAPIServer() as api, OCIRegistry() as registry:
        yield GateCluster(api, registry, tmp_path, TOKEN)
