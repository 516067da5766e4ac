"""The gate as a kured blocker, on the real kube-apiserver: its pod's label held or open, as the
kured variant's DaemonSet makes the pod (deploy/reboot-gate/kured, its privileged namespace).

update_engine is the unit tests' stand-in on a private socket (fake_dbus.py): its D-Bus
exchange is tested there; kured's own flow, with the real kured, in test_kured_flow.py.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from apiserver import Cluster
from fake_dbus import FakeSystemBus
from gate import install
from gate_cluster import NAMESPACE, GateCluster
from gate_manifests import DEPLOY

from nvidia_driver.gate.managers import HELD, OPEN, POD_LABEL, VERDICT, Manager

pytestmark = pytest.mark.cluster

PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


@pytest.fixture(scope="module", autouse=True)
def kured_variant(prepared: Cluster) -> Iterator[None]:
    """deploy/reboot-gate/kured for this module; the FLUO variant's again afterwards."""
    install(prepared, "kured")
    yield
    install(prepared, "fluo")


def gate_pod(node: str) -> dict[str, Any]:
    """The DaemonSet's pod on node, as kured/0500_daemonset.yaml's template makes it."""
    daemonset = yaml.safe_load((DEPLOY / "kured" / "0500_daemonset.yaml").read_text())
    template = daemonset["spec"]["template"]
    return {"metadata": template["metadata"], "spec": {**template["spec"], "nodeName": node},
            "status": {"phase": "Running"}}  # fmt: skip


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[FakeSystemBus]:
    with FakeSystemBus(tmp_path / "system_bus_socket") as system_bus:
        yield system_bus


def test_with_nothing_staged_the_gate_holds_and_says_nothing(
    gpu_cluster: GateCluster, bus: FakeSystemBus
) -> None:
    """No release waits for a reboot: the pod stays held, the node says why, and no event is
    recorded; the D-Bus exchange is made as the pod's uid."""
    gpu_cluster.add_node("gpu-1")
    gpu_cluster.cluster_policy("610.57.04")
    gpu_cluster.api.put(f"{PODS}/nvidia-reboot-gate-gpu-1", gate_pod("gpu-1"))
    verdict = gpu_cluster.gate("gpu-1", Manager.KURED, system_bus=bus.path).step()
    assert verdict is not None
    assert verdict.line == "no Flatcar release is staged (update_engine waits for no reboot)"
    labels = gpu_cluster.api.get(f"{PODS}/nvidia-reboot-gate-gpu-1")["metadata"]["labels"]
    assert labels[POD_LABEL] == HELD
    assert gpu_cluster.node("gpu-1")["metadata"]["annotations"][VERDICT] == f"held: {verdict.line}"
    assert gpu_cluster.events() == []
    assert bus.uids == [str(os.getuid())]
    assert [call.member for call in bus.calls] == ["Hello", "GetNameOwner", "GetStatus"]


def test_a_restarted_gate_blocks_before_it_looks_again(
    gpu_cluster: GateCluster, bus: FakeSystemBus
) -> None:
    """Pod labels outlive a container restart: the gate holds first, then decides."""
    gpu_cluster.add_node("gpu-1")
    pod = gate_pod("gpu-1")
    pod["metadata"]["labels"][POD_LABEL] = OPEN
    path = f"{PODS}/nvidia-reboot-gate-gpu-1"
    gpu_cluster.api.put(path, pod)
    stop = threading.Event()
    stop.set()
    gpu_cluster.gate("gpu-1", Manager.KURED, system_bus=bus.path).run(stop)
    assert gpu_cluster.api.get(path)["metadata"]["labels"][POD_LABEL] == HELD
