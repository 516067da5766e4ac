"""kured's real flow with our gate: a reboot is required (kured's sentinel), and the real kured
(1.16.1) reboots the node only once the gate's pod stops matching its
``--blocking-pod-selector``, which the gate allows once the staged release's image exists. Its
reboot command only records (kured.py); nothing reboots.

The gate runs as ``nvidia-driver reboot-gate --manager kured`` with deploy/reboot-gate's
ServiceAccount and roles, asks update_engine (a stand-in on a private dbus-daemon,
system_bus.py) what it staged, and labels its own pod: the pod object is created as the
DaemonSet controller would and its status written as the kubelet would (pods.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from apiserver import Cluster
from gate import NAMESPACE as GATE_NAMESPACE
from gate import gate_env, kubelet_pulled, node_event_reasons, push_image, run_gate_once
from gpu_operator import wait_for
from kured import LOCK, running_kured
from kured import NAMESPACE as KURED_NAMESPACE
from pods import daemonset_pod
from reboot_scenario import DRIVER, STAGED, RebootScenario
from system_bus import private_system_bus

from nvidia_driver.gate.managers import HELD, POD_LABEL, VERDICT

pytestmark = pytest.mark.cluster

SELECTOR = f"{POD_LABEL}={HELD}"  # kured's --blocking-pod-selector (deploy/reboot-gate/kured)
DAEMONSET = "nvidia-reboot-gate"  # deploy/reboot-gate/kured/0500_daemonset.yaml
NODE = "gpu-kured"
# kured waits 30 to 90 s before its first look (delaytick, kured.py), then every --period.
FIRST_LOOK_SECONDS = 150.0


@pytest.fixture
def scenario(cluster: Cluster, rebooting: RebootScenario) -> Iterator[Cluster]:
    """kured and the gate's variant for it installed, a GPU node in its pool (deleted after)."""
    with cluster.deleted_after(
        f"/api/v1/nodes/{NODE}",
        "/apis/nvidia.com/v1alpha1/nvidiadrivers/kured-pool",
        f"/api/v1/namespaces/{GATE_NAMESPACE}/pods/{DAEMONSET}-{NODE}",
    ):
        rebooting.install("kured")
        rebooting.gpu_node(NODE, "kured-pool")
        yield cluster


def test_kured_reboots_a_gpu_node_only_once_the_staged_release_has_its_image(
    scenario: Cluster, rebooting: RebootScenario, tmp_path: Path
) -> None:
    cluster = scenario
    daemonset = cluster.get(f"/apis/apps/v1/namespaces/{GATE_NAMESPACE}/daemonsets/{DAEMONSET}")
    pod = daemonset_pod(cluster, daemonset, NODE)
    pod_path = f"/api/v1/namespaces/{GATE_NAMESPACE}/pods/{pod['metadata']['name']}"
    assert pod["metadata"]["labels"][POD_LABEL] == "held"  # from the template: held from the start
    kured_log = cluster.logs / "kured.log"

    def pod_label() -> str:
        return str(cluster.get(pod_path)["metadata"]["labels"].get(POD_LABEL))

    def verdict() -> str:
        annotations = cluster.get(f"/api/v1/nodes/{NODE}")["metadata"].get("annotations") or {}
        return str(annotations.get(VERDICT, ""))

    with (
        private_system_bus(tmp_path, cluster.logs, staged=STAGED) as bus,
        running_kured(
            cluster, rebooting.binaries["kured"], tmp_path, NODE, blocking_pod_selector=SELECTOR
        ) as kured,  # fmt: skip
    ):
        kured.sentinel.touch()  # update_engine's postinst: a reboot is required
        env = {
            **gate_env(cluster, NODE, rebooting.releases_feed, tmp_path),
            "POD_NAME": pod["metadata"]["name"],
        }  # the downward API's metadata.name
        held = run_gate_once(cluster, env, tmp_path, "kured", bus.directory)
        assert held.returncode == 0, held.stderr
        assert bus.update_engine.calls, "the gate never asked update_engine"
        assert pod_label() == "held"
        assert verdict().startswith("held"), (verdict(), held.stderr)
        assert STAGED in verdict()
        assert "RebootHeld" in node_event_reasons(cluster, NODE)

        # kured looks, finds the gate's pod, and does not reboot.
        wait_for("kured blocked by the gate's pod",
                 lambda: f"matching pods: [{pod['metadata']['name']}]" in kured_log.read_text(),
                 kured_log, FIRST_LOOK_SECONDS)  # fmt: skip
        assert kured.rebooted() == []
        assert not cluster.get(f"/api/v1/nodes/{NODE}")["spec"].get("unschedulable")

        image = push_image(rebooting.registry.address, "gdc/driver", f"{DRIVER}-flatcar{STAGED}")
        pulling = run_gate_once(
            cluster, env, tmp_path, "kured", bus.directory
        )  # pre-pull: the image onto the node first
        assert pulling.returncode == 0, pulling.stderr
        assert kubelet_pulled(cluster, NODE) == [image]
        allowed = run_gate_once(cluster, env, tmp_path, "kured", bus.directory)
        assert allowed.returncode == 0, allowed.stderr
        assert pod_label() == "open", allowed.stderr
        assert verdict().startswith("allowed"), verdict()
        assert "RebootAllowed" in node_event_reasons(cluster, NODE)

        # kured's next look: it takes its lock, cordons, drains (the gate's DaemonSet pod
        # stays) and runs its reboot command, which here only records.
        wait_for("kured's reboot command", kured.rebooted, kured_log, 60)
        assert len(kured.rebooted()) == 1, kured.rebooted()
        assert cluster.get(f"/api/v1/nodes/{NODE}")["spec"].get("unschedulable") is True
        lock = cluster.get(f"/apis/apps/v1/namespaces/{KURED_NAMESPACE}/daemonsets/kured")
        assert NODE in lock["metadata"]["annotations"][LOCK]
        cluster.get(pod_path)  # not evicted
