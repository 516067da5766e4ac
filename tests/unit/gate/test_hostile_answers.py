"""API server answers the gate cannot read hold the reboot, with their reason: never a
traceback. A body nested 1,000 deep, a node of the wrong shape, a 16 MiB list page (injected:
a real server never sends them) are each a held verdict, and no answer takes the gate past its
pod's memory limit. Feeds and manifests it cannot read: tests/integration/cluster/decisions."""

from __future__ import annotations

import threading
import tracemalloc
from typing import Any

import pytest
from conftest import STAGED, Cluster
from oci_registry import INDEX, OCIRegistry

from nvidia_driver.errors import DriverError
from nvidia_driver.gate.managers import BEFORE_REBOOT, NEW_VERSION, VERDICT
from nvidia_driver.gate.registry import ImageRef, Registry
from nvidia_driver.limits import MiB
from nvidia_driver.sources.download import Backoff

DEEP = b'{"a":' * 1000 + b"1" + b"}" * 1000
HUGE_INTEGER = b'{"n": ' + b"9" * 5000 + b"}"
TAG = f"610.57.04-flatcar{STAGED}"


def test_a_deep_answer_from_the_api_server_holds(cluster: Cluster) -> None:
    cluster.published()
    cluster.api.raw["/apis/nvidia.com/v1/clusterpolicies"] = DEEP
    verdict = cluster.judge()
    assert not verdict.allowed
    path = "/apis/nvidia.com/v1/clusterpolicies"
    assert f"the answer to GET {path}: not JSON (nested deeper" in verdict.line


def test_a_node_of_the_wrong_shape_holds(cluster: Cluster) -> None:
    cluster.published()
    cluster.api.edit("/api/v1/nodes/gpu-1", lambda node: node.update(status=[]))
    verdict = cluster.judge()
    assert not verdict.allowed
    assert "cannot check its driver image" in verdict.line


def test_a_16_mib_list_page_is_refused_within_the_pods_memory(cluster: Cluster) -> None:
    """The page is cut at the gate's bound: it never becomes millions of dicts."""
    cluster.published()
    page = b'{"items": [' + b"{}," * ((16 * MiB - 16) // 3) + b"{}]}"  # within 16 MiB
    cluster.api.raw["/api/v1/nodes"] = page
    tracemalloc.start()
    try:
        verdict = cluster.judge()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not verdict.allowed
    assert "over the limit" in verdict.line or "more than" in verdict.line
    assert peak < 64 * MiB


class _Once(threading.Event):
    """Stops the gate's loop after one step."""

    def wait(self, timeout: float | None = None) -> bool:
        del timeout
        self.set()
        return True


def test_a_step_that_meets_an_unreadable_node_holds_and_the_gate_runs_on(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.published()

    def asked(node: dict[str, Any]) -> None:
        node["metadata"]["labels"][BEFORE_REBOOT] = "true"
        node["metadata"]["annotations"] = {NEW_VERSION: STAGED, VERDICT: []}

    cluster.api.edit("/api/v1/nodes/gpu-1", asked)
    # the list of the nodes FLUO asks about, which the Deployment's gate (--others) reads
    cluster.api.raw["/api/v1/nodes"] = b'{"items": [{"metadata": []}]}'
    cluster.gate("gpu-1", others=True).run(_Once())
    out = capsys.readouterr().out
    assert "the reboot stays held" in out
    assert "Traceback" not in out


def test_the_registry_client_refuses_deep_json_with_a_driver_error() -> None:
    registry = Registry(backoff=Backoff(attempts=1), sleep=lambda _: None)
    with OCIRegistry() as served:
        served.put("o/driver", [TAG], INDEX, DEEP)
        with pytest.raises(DriverError, match="nested deeper"):
            registry.presence(ImageRef.parse(f"{served.host}/o/driver:{TAG}"), "amd64")
