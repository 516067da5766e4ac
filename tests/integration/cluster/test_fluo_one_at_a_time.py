"""While the gate holds one node, FLUO reboots no other: its update-operator lets one node at a
time past before-reboot (``maxRebootingNodes``, 1 by default), and a node waiting for the gate's
approval is that one. What a platform engineer sees on a fleet whose staged release has no
image yet: every node waits for that image, not only the one FLUO picked.

The real update-operator and two real update-agents (v0.10.0-rc2), the real kube-apiserver,
``nvidia-driver reboot-gate --manager fluo`` for each node with deploy/reboot-gate's
ServiceAccount; update_engine and logind stood in for on a private bus per node
(system_bus.py), as in test_fluo_flow.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from apiserver import Cluster
from fluo import fluo_logs, running_agent, running_operator
from gate import gate_env, kubelet_pulled, push_image, run_gate_once
from gpu_operator import wait_for
from reboot_scenario import DRIVER, RUNNING, STAGED, RebootScenario
from system_bus import private_system_bus
from test_fluo_flow import STEP_SECONDS

from nvidia_driver.gate.managers import APPROVAL, BEFORE_REBOOT, REBOOT_NEEDED, REBOOT_OK

pytestmark = pytest.mark.cluster

NODES = ("gpu-fluo-a", "gpu-fluo-b")
# Each node's own directory: short, as the bus socket's path must be (108 bytes, sun_path).
WORKDIRS = {"gpu-fluo-a": "a", "gpu-fluo-b": "b"}


@pytest.fixture
def scenario(cluster: Cluster, rebooting: RebootScenario) -> Iterator[Cluster]:
    """FLUO and the gate's variant for it installed, GPU nodes each in its own pool (deleted
    after)."""
    paths = [f"/api/v1/nodes/{node}" for node in NODES]
    paths += [f"/apis/nvidia.com/v1alpha1/nvidiadrivers/{node}" for node in NODES]
    with cluster.deleted_after(*paths):
        rebooting.install("fluo")
        for name in NODES:
            rebooting.gpu_node(name, name)
        yield cluster


def test_a_held_node_keeps_fluo_from_rebooting_the_others(
    scenario: Cluster, rebooting: RebootScenario, tmp_path: Path
) -> None:
    cluster = scenario
    fluo = rebooting.binaries["fluo"]
    operator_log, agent_log = fluo_logs(cluster)

    metadata = cluster.node_metadata

    def picked() -> list[str]:
        return [name for name in NODES if metadata(name, "labels").get(BEFORE_REBOOT) == "true"]

    with contextlib.ExitStack() as running:
        buses = {}
        for name in NODES:
            workdir = tmp_path / WORKDIRS[name]
            workdir.mkdir()
            buses[name] = running.enter_context(private_system_bus(workdir, cluster.logs))
            running.enter_context(running_agent(cluster, fluo, workdir, name, bus=buses[name],
                                                version=RUNNING))  # fmt: skip
        running.enter_context(running_operator(cluster, fluo, tmp_path, [APPROVAL]))
        for name in NODES:
            wait_for(f"{name}'s agent asking update_engine", lambda n=name: buses[n].update_engine
                     .calls, agent_log, 60)  # fmt: skip
            buses[name].update_engine.stage(STAGED)
        for name in NODES:
            wait_for(f"reboot-needed on {name}", lambda n=name: metadata(n, "annotations")
                     .get(REBOOT_NEEDED) == "true", agent_log, 60)  # fmt: skip

        # The operator picks one node; its gate holds: the image of the staged release is not
        # published.
        wait_for("the operator's before-reboot label", picked, operator_log, STEP_SECONDS)
        [first] = picked()
        [second] = [name for name in NODES if name != first]
        envs = {
            name: gate_env(cluster, name, rebooting.releases_feed, tmp_path / WORKDIRS[name])
            for name in NODES
        }
        held = run_gate_once(cluster, envs[first], tmp_path / WORKDIRS[first])
        assert held.returncode == 0, held.stderr
        assert metadata(first, "annotations").get(APPROVAL) != "true"

        # Two more passes of the operator: the other node, asking as well, is not let past.
        passes = operator_log.read_text().count("rebooted nodes")
        wait_for("two more passes of the operator",
                 lambda: operator_log.read_text().count("rebooted nodes") >= passes + 2,
                 operator_log, 2 * STEP_SECONDS)  # fmt: skip
        assert picked() == [first]
        assert metadata(second, "annotations").get(REBOOT_NEEDED) == "true"
        assert all(buses[name].logind.reboots == [] for name in NODES)

        # The image is published: the first node's gate pre-pulls, approves, and FLUO reboots
        # it; the second still waits, now behind a reboot in progress.
        image = push_image(rebooting.registry.address, "gdc/driver", f"{DRIVER}-flatcar{STAGED}")
        run_gate_once(cluster, envs[first], tmp_path / WORKDIRS[first])
        assert kubelet_pulled(cluster, first) == [image]
        allowed = run_gate_once(cluster, envs[first], tmp_path / WORKDIRS[first])
        assert allowed.returncode == 0, allowed.stderr
        wait_for("the operator's reboot-ok",
                 lambda: metadata(first, "annotations").get(REBOOT_OK) == "true", operator_log,
                 STEP_SECONDS)  # fmt: skip
        wait_for("the agent's call to logind's Reboot", lambda: buses[first].logind.reboots,
                 agent_log, 60)  # fmt: skip
        assert buses[second].logind.reboots == []
        assert BEFORE_REBOOT not in metadata(second, "labels")
