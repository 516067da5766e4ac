"""The reboot gate's two halves, with FLUO's own flow: held while the image is missing, let go
once it is published.

Node gpu-1 runs stable 4593.2.4; update_engine stages 4593.2.5. The ClusterPolicy asks for the
precompiled image of each release (driver.version=610.57.04), and the registry has 4593.2.4's
but not 4593.2.5's yet. FLUO's operator is configured with the gate's annotation in
--before-reboot-annotations; the API server enforces the RBAC of deploy/reboot-gate.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import STAGED, Cluster
from fake_apiserver import Fault
from fluo_sim import BEFORE_REBOOT, REBOOT_OK, Agent, Client, Operator

from nvidia_driver.gate.managers import APPROVAL, NEW_VERSION, VERDICT

MISSING = "610.57.04-flatcar4593.2.5"


def test_a_reboot_waits_for_its_image_and_goes_once_it_is_published(cluster: Cluster) -> None:
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04")
    cluster.publish("610.57.04-flatcar4593.2.4")
    fluo = Client(cluster.api.url)
    operator, agent = Operator(fluo, before_reboot_annotations=[APPROVAL]), Agent(fluo, "gpu-1")
    gate = cluster.gate("gpu-1")

    agent.update_engine_staged(STAGED)
    operator.process()  # markBeforeReboot: the node is labelled before-reboot=true
    assert cluster.node("gpu-1")["metadata"]["labels"][BEFORE_REBOOT] == "true"

    # The first half: no image for 4593.2.5, the reboot is held, and the node says why.
    verdict = gate.step()
    line = f"flatcar {STAGED}: {cluster.repository}/driver:{MISSING} not published yet"
    assert verdict is not None
    assert not verdict.allowed
    assert verdict.line == line
    annotations = cluster.node("gpu-1")["metadata"]["annotations"]
    assert annotations[VERDICT] == f"held: {line}"
    assert APPROVAL not in annotations
    [event] = cluster.events()  # accepted by the API server's Event validation, in default
    assert (event["reason"], event["type"], event["message"]) == ("RebootHeld", "Warning", line)
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "gpu-1",
        "uid": "gpu-1",
    }
    operator.process()  # checkBeforeReboot: the gate's annotation is missing
    assert not agent.may_reboot()
    assert gate.step() == verdict  # looked again: still missing, nothing new to say
    assert len(cluster.events()) == 1

    # The second half: the nightly publishes 4593.2.5's image; the gate lets the reboot go.
    cluster.publish(MISSING)
    verdict = gate.step()
    assert verdict is not None
    assert verdict.allowed
    assert verdict.line == f"flatcar {STAGED}: {cluster.repository}/driver:{MISSING} published"
    assert cluster.node("gpu-1")["metadata"]["annotations"][APPROVAL] == "true"
    operator.process()  # checkBeforeReboot: every annotation true -> reboot-ok=true
    assert agent.may_reboot()
    after = cluster.node("gpu-1")["metadata"]
    assert BEFORE_REBOOT not in after["labels"]  # FLUO took its label and the annotation back
    assert APPROVAL not in after["annotations"]
    assert after["annotations"][REBOOT_OK] == "true"
    assert [e["reason"] for e in cluster.events()] == ["RebootHeld", "RebootAllowed"]
    assert gate.step() is None  # FLUO no longer asks


def test_an_event_the_api_server_refuses_is_said_in_one_line(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """The annotation carries the verdict still; the lost event is not lost silently."""
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04")
    cluster.api.edit("/api/v1/nodes/gpu-1", _asked)
    cluster.api.faults.append(Fault("POST", "/api/v1/namespaces/default/events", 403))
    verdict = cluster.gate("gpu-1").step()
    assert verdict is not None
    assert not verdict.allowed
    [line] = [line for line in capsys.readouterr().out.splitlines() if "event" in line]
    assert line.startswith("WARNING: reboot gate: cannot record the event: Kubernetes API: POST ")


def _asked(node: dict[str, Any]) -> None:
    """FLUO's operator asking: before-reboot=true, and the agent's new-version."""
    node["metadata"]["labels"][BEFORE_REBOOT] = "true"
    node["metadata"]["annotations"][NEW_VERSION] = STAGED
