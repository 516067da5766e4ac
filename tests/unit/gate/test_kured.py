"""The gate as a kured blocker: update_engine asked over D-Bus, the pod's label held or open.

kured's own flow (its --blocking-pod-selector matching the gate's pod, its lock, its reboot)
runs for real in tests/integration/cluster/test_kured_flow.py.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import NAMESPACE, Cluster
from fake_dbus import FakeSystemBus

from nvidia_driver.errors import DriverError
from nvidia_driver.gate.managers import HELD, OPEN, POD_LABEL, VERDICT, Manager
from nvidia_driver.gate.updateengine import read_status

PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def gate_pod(node: str) -> dict[str, Any]:
    """The DaemonSet's pod, as kured/0500_daemonset.yaml's template makes it."""
    return {
        "metadata": {"labels": {"app": "nvidia-reboot-gate", POD_LABEL: HELD}},
        "spec": {"nodeName": node},
        "status": {"phase": "Running"},
    }


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[FakeSystemBus]:
    with FakeSystemBus(tmp_path / "system_bus_socket") as system_bus:
        yield system_bus


def test_with_nothing_staged_the_gate_holds_and_says_nothing(
    cluster: Cluster, bus: FakeSystemBus
) -> None:
    """No release waits for a reboot: the pod stays held, the node says why, and no event is
    recorded; the D-Bus exchange is made as the pod's uid."""
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04")
    cluster.api.put(f"{PODS}/nvidia-reboot-gate-gpu-1", gate_pod("gpu-1"))
    verdict = cluster.gate("gpu-1", Manager.KURED, system_bus=bus.path).step()
    assert verdict is not None
    assert verdict.line == "no Flatcar release is staged (update_engine waits for no reboot)"
    labels = cluster.api.get(f"{PODS}/nvidia-reboot-gate-gpu-1")["metadata"]["labels"]
    assert labels[POD_LABEL] == HELD
    assert cluster.node("gpu-1")["metadata"]["annotations"][VERDICT] == f"held: {verdict.line}"
    assert cluster.events() == []
    assert bus.uids == [str(os.getuid())]
    assert [call.member for call in bus.calls] == ["Hello", "GetNameOwner", "GetStatus"]


def test_a_restarted_gate_blocks_before_it_looks_again(
    cluster: Cluster, bus: FakeSystemBus
) -> None:
    """Pod labels outlive a container restart: the gate holds first, then decides."""
    cluster.add_node("gpu-1")
    pod = gate_pod("gpu-1")
    pod["metadata"]["labels"][POD_LABEL] = OPEN
    path = f"{PODS}/nvidia-reboot-gate-gpu-1"
    cluster.api.put(path, pod)
    stop = threading.Event()
    stop.set()
    cluster.gate("gpu-1", Manager.KURED, system_bus=bus.path).run(stop)
    assert cluster.api.get(path)["metadata"]["labels"][POD_LABEL] == HELD


def test_update_engine_not_on_the_bus_is_one_line(bus: FakeSystemBus, tmp_path: Path) -> None:
    bus.update_engine = False
    with pytest.raises(DriverError) as caught:
        read_status(bus.path)
    assert str(caught.value) == (
        "cannot ask update_engine what it staged: GetNameOwner failed: "
        "org.freedesktop.DBus.Error.NameHasNoOwner; the gate's pod needs the host's "
        "/run/dbus/system_bus_socket mounted and uid 500, core's (deploy/reboot-gate/kured)"
    )
    with pytest.raises(DriverError, match=r"^cannot ask update_engine what it staged: .*No such"):
        read_status(tmp_path / "absent")


def test_update_engine_s_status_says_what_waits_for_a_reboot(bus: FakeSystemBus) -> None:
    assert read_status(bus.path).staged == ""
    bus.stage("4593.2.5")
    status = read_status(bus.path)
    assert (status.current_operation, status.staged) == (
        "UPDATE_STATUS_UPDATED_NEED_REBOOT",
        "4593.2.5",
    )


def test_only_update_engines_own_reply_is_its_answer(bus: FakeSystemBus) -> None:
    """A reply to the same serial from another client is not update_engine's status: only the
    owner of com.coreos.update1 (GetNameOwner) is believed."""
    bus.stage("4593.2.5")
    bus.forge = True
    assert read_status(bus.path).staged == "4593.2.5"
    assert [call.member for call in bus.calls] == ["Hello", "GetNameOwner", "GetStatus"]
    assert bus.calls[1].argument == "com.coreos.update1"
