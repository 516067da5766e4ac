"""A cluster without GPU nodes, or whose GPU nodes run no gate, updates under FLUO as before.

FLUO waits for every annotation in ``--before-reboot-annotations`` on the node it picks, the
gate's among them. Only the gate's Deployment (deploy/reboot-gate/fluo/0600_deployment.yaml,
``reboot-gate --others``) answers for nodes no gate pod runs on: here a CPU node, with FLUO's
own update-operator and update-agent, and update_engine and logind stood in for on a private
bus (system_bus.py), as in test_fluo_flow.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import peers
import pytest
from apiserver import Cluster
from fluo import install as install_fluo
from fluo import running_agent, running_operator
from gate import gate_env, install, run_gate_once
from gpu_operator import GPU_PRESENT, flatcar_node, register_node, wait_for
from reboot_scenario import KERNEL, RUNNING, STAGED
from system_bus import private_system_bus
from test_fluo_flow import STEP_SECONDS

from nvidia_driver.gate.managers import APPROVAL, BEFORE_REBOOT, REBOOT_NEEDED, REBOOT_OK

pytestmark = pytest.mark.cluster

NODE = "cpu-fluo"


@pytest.fixture
def scenario(cluster: Cluster) -> Iterator[Cluster]:
    with cluster.deleted_after(f"/api/v1/nodes/{NODE}"):
        yield cluster


def test_a_cpu_node_reboots_under_fluo_with_the_gate_installed(
    scenario: Cluster, *, peer_dirs: dict[str, Path], releases_feed: str, tmp_path: Path
) -> None:
    cluster = scenario
    install(cluster, "fluo")
    install_fluo(cluster, peers.module_dir(peers.load()["fluo"]))
    cpu = flatcar_node(NODE, RUNNING, KERNEL)
    del cpu["metadata"]["labels"][GPU_PRESENT]  # a CPU node: no gate pod runs here
    register_node(cluster, cpu)
    fluo = peer_dirs["fluo"]
    operator_log = cluster.logs / "update-operator.log"
    agent_log = cluster.logs / "update-agent.log"

    def annotations() -> dict[str, str]:
        return cluster.node_metadata(NODE, "annotations")

    def labels() -> dict[str, str]:
        return cluster.node_metadata(NODE, "labels")

    with (
        private_system_bus(tmp_path, cluster.logs) as bus,
        running_operator(cluster, fluo, tmp_path, [APPROVAL]),
        running_agent(cluster, fluo, tmp_path, NODE, bus=bus, version=RUNNING),
    ):
        wait_for("the agent's first status", lambda: bus.update_engine.calls, agent_log, 60)
        bus.update_engine.stage(STAGED)
        wait_for("reboot-needed from the agent",
                 lambda: annotations().get(REBOOT_NEEDED) == "true", agent_log, 60)  # fmt: skip
        wait_for("the operator's before-reboot label",
                 lambda: labels().get(BEFORE_REBOOT) == "true", operator_log,
                 STEP_SECONDS)  # fmt: skip
        # The Deployment's gate: no node of its own, it answers for the node no gate runs on.
        env = gate_env(cluster, "", releases_feed, tmp_path)
        answered = run_gate_once(cluster, env, tmp_path, others=True)
        assert answered.returncode == 0, answered.stderr
        assert annotations().get(APPROVAL) == "true", (annotations(), answered.stderr)
        wait_for("the operator's reboot-ok", lambda: annotations().get(REBOOT_OK) == "true",
                 operator_log, STEP_SECONDS)  # fmt: skip
        wait_for("the agent's call to logind's Reboot", lambda: bus.logind.reboots, agent_log,
                 60)  # fmt: skip
        assert bus.logind.reboots == [False]
