"""FLUO's real flow with our gate: update_engine stages a release, FLUO's real agent and
operator ask for the reboot, the gate holds it until the release's image exists, then lets it
go, and the agent asks logind to reboot (a stand-in that records it: nothing reboots).

Everything but update_engine and logind is the real thing: kube-apiserver, FLUO's
update-operator and update-agent (v0.10.0-rc2, with its own examples' RBAC), and
``nvidia-driver reboot-gate --manager fluo`` with deploy/reboot-gate's ServiceAccount and
roles. update_engine and logind are stand-ins on a private dbus-daemon (system_bus.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from apiserver import Cluster
from fluo import fluo_logs, running_agent, running_operator
from gate import gate_env, kubelet_pulled, node_event_reasons, push_image, run_gate_once
from gpu_operator import wait_for
from reboot_scenario import DRIVER, RUNNING, STAGED, RebootScenario
from system_bus import NEED_REBOOT, private_system_bus

from nvidia_driver.gate.managers import (
    APPROVAL,
    BEFORE_REBOOT,
    FLUO_PREFIX,
    NEW_VERSION,
    REBOOT_NEEDED,
    REBOOT_OK,
    VERDICT,
)

pytestmark = pytest.mark.cluster

# FLUO's names the gate does not use (flatcar-linux-update-operator v0.10.0-rc2
# pkg/constants/constants.go); the others are the gate's (gate/managers.py).
REBOOT_IN_PROGRESS = f"{FLUO_PREFIX}reboot-in-progress"
STATUS = f"{FLUO_PREFIX}status"
NODE = "gpu-fluo"
# The operator's reconciliation is every 30 s (pkg/operator/operator.go), the agent answers at
# once: a step waits for two of the operator's passes at most.
STEP_SECONDS = 75.0


@pytest.fixture
def scenario(cluster: Cluster, rebooting: RebootScenario) -> Iterator[Cluster]:
    """FLUO and the gate's variant for it installed, a GPU node in its pool (deleted after)."""
    with cluster.deleted_after(f"/api/v1/nodes/{NODE}",
                               "/apis/nvidia.com/v1alpha1/nvidiadrivers/fluo-pool"):  # fmt: skip
        rebooting.install("fluo")
        rebooting.gpu_node(NODE, "fluo-pool")
        yield cluster


def node(cluster: Cluster) -> dict[str, object]:
    return cluster.get(f"/api/v1/nodes/{NODE}")


def annotations(cluster: Cluster) -> dict[str, str]:
    return cluster.node_metadata(NODE, "annotations")


def labels(cluster: Cluster) -> dict[str, str]:
    return cluster.node_metadata(NODE, "labels")


def test_fluo_reboots_a_gpu_node_only_once_the_staged_release_has_its_image(
    scenario: Cluster, rebooting: RebootScenario, tmp_path: Path
) -> None:
    cluster = scenario
    fluo = rebooting.binaries["fluo"]
    operator_log, agent_log = fluo_logs(cluster)

    with (
        private_system_bus(tmp_path, cluster.logs) as bus,
        running_operator(cluster, fluo, tmp_path, [APPROVAL]),
        running_agent(cluster, fluo, tmp_path, NODE, bus=bus, version=RUNNING),
    ):
        # The agent reads update_engine's status (GetStatus) and puts it on its node.
        wait_for("the agent's status annotation",
                 lambda: annotations(cluster).get(STATUS), agent_log, 60)  # fmt: skip
        assert bus.update_engine.calls, "the agent never asked update_engine"

        # update_engine applies an update: StatusUpdate, and the agent asks for a reboot.
        bus.update_engine.stage(STAGED)
        wait_for("reboot-needed and new-version from the agent",
                 lambda: annotations(cluster).get(REBOOT_NEEDED) == "true"
                 and annotations(cluster).get(NEW_VERSION) == STAGED, agent_log, 60)  # fmt: skip
        assert annotations(cluster)[STATUS] == NEED_REBOOT

        # The operator picks the node: before-reboot, the gate's turn.
        wait_for("the operator's before-reboot label",
                 lambda: labels(cluster).get(BEFORE_REBOOT) == "true", operator_log,
                 STEP_SECONDS)  # fmt: skip
        env = gate_env(cluster, NODE, rebooting.releases_feed, tmp_path)
        held = run_gate_once(cluster, env, tmp_path)
        assert held.returncode == 0, held.stderr
        said = annotations(cluster)
        assert said.get(APPROVAL) != "true", said
        assert said.get(VERDICT, "").startswith("held"), said
        assert STAGED in said[VERDICT], said
        assert "RebootHeld" in node_event_reasons(cluster, NODE), held.stderr

        # The hold holds: the operator passes over the node again and sets no reboot-ok.
        passes = operator_log.read_text().count("rebooted nodes")
        wait_for("another pass of the operator",
                 lambda: operator_log.read_text().count("rebooted nodes") > passes,
                 operator_log, STEP_SECONDS)  # fmt: skip
        assert annotations(cluster).get(REBOOT_OK) != "true", annotations(cluster)
        assert labels(cluster).get(BEFORE_REBOOT) == "true", labels(cluster)
        assert bus.logind.reboots == []

        # The staged release's image is published: the gate approves, FLUO lets the agent go.
        image = push_image(rebooting.registry.address, "gdc/driver", f"{DRIVER}-flatcar{STAGED}")
        pulling = run_gate_once(cluster, env, tmp_path)  # pre-pull: the image onto the node first
        assert pulling.returncode == 0, pulling.stderr
        assert kubelet_pulled(cluster, NODE) == [image]
        allowed = run_gate_once(cluster, env, tmp_path)
        assert allowed.returncode == 0, allowed.stderr
        assert annotations(cluster).get(APPROVAL) == "true", (annotations(cluster), allowed.stderr)
        assert "RebootAllowed" in node_event_reasons(cluster, NODE)
        wait_for("the operator's reboot-ok",
                 lambda: annotations(cluster).get(REBOOT_OK) == "true", operator_log,
                 STEP_SECONDS)  # fmt: skip
        # The agent cordons, drains (nothing but DaemonSet pods would run here) and asks
        # logind to reboot, not interactively (pkg/agent/agent.go: k.lc.Reboot(false)).
        wait_for("the agent's call to logind's Reboot", lambda: bus.logind.reboots, agent_log,
                 60)  # fmt: skip
        assert bus.logind.reboots == [False]
        done = node(cluster)
        assert done["spec"].get("unschedulable") is True  # type: ignore[index]
        assert annotations(cluster).get(REBOOT_IN_PROGRESS) == "true"
        assert BEFORE_REBOOT not in labels(cluster)
        assert APPROVAL not in annotations(cluster)  # the operator cleans up its hooks' answers
