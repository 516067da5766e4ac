"""FLUO's reboot coordination, step for step, against a Kubernetes API server.

A port of what flatcar/flatcar-linux-update-operator (8dd83d7) does to nodes, so that the gate
is tested against the real flow rather than against a guess of it:

* the agent (``pkg/agent/agent.go``): ``updateStatusCallback`` writes ``status``,
  ``last-checked-time`` and ``new-version`` and, on ``UPDATE_STATUS_UPDATED_NEED_REBOOT``,
  ``reboot-needed=true`` as annotation and label; after the reboot it writes
  ``reboot-needed=false`` and ``reboot-in-progress=false`` (``process``, on start);
* the operator (``pkg/operator/operator.go`` ``process``): ``cleanupState``,
  ``checkAfterReboot``, ``markAfterReboot``, ``checkBeforeReboot``, ``markBeforeReboot``, in that
  order, each node change an ``UpdateNodeRetry`` (get, change, update with the object's
  resourceVersion, again on a conflict), with ``maxRebootingNodes`` 1.

The selectors are FLUO's own: ``rebootableSelector``, ``justRebootedSelector``,
``stillRebootingSelector``, ``beforeRebootReq`` and ``afterRebootReq``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PREFIX = "flatcar-linux-update.v1.flatcar-linux.net/"  # pkg/constants/constants.go
REBOOT_NEEDED = PREFIX + "reboot-needed"
REBOOT_IN_PROGRESS = PREFIX + "reboot-in-progress"
REBOOT_OK = PREFIX + "reboot-ok"
REBOOT_PAUSED = PREFIX + "reboot-paused"
STATUS = PREFIX + "status"
LAST_CHECKED = PREFIX + "last-checked-time"
NEW_VERSION = PREFIX + "new-version"
BEFORE_REBOOT = PREFIX + "before-reboot"
AFTER_REBOOT = PREFIX + "after-reboot"
TRUE, FALSE = "true", "false"
NEED_REBOOT = "UPDATE_STATUS_UPDATED_NEED_REBOOT"


@dataclass
class Client:
    """The API calls FLUO makes: list nodes, get a node, update (PUT) it."""

    base_url: str
    token: str = "fluo-service-account-token"  # noqa: S105 - the fake API server's

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"}
        request = urllib.request.Request(self.base_url + path, data, headers, method=method)  # noqa: S310
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return json.loads(response.read())

    def nodes(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/api/v1/nodes")["items"])

    def update_node_retry(self, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        """k8sutil.UpdateNodeRetry: retry.RetryOnConflict(DefaultBackoff: 4 steps)."""
        for _ in range(4):
            node = self._call("GET", f"/api/v1/nodes/{name}")
            node["metadata"].setdefault("labels", {})
            node["metadata"].setdefault("annotations", {})
            change(node)
            try:
                self._call("PUT", f"/api/v1/nodes/{name}", node)
            except urllib.error.HTTPError as exc:
                if exc.code != 409:
                    raise
                continue
            return
        raise AssertionError(f"updating node {name!r}: conflicts until the backoff ran out")


def _annotations(node: dict[str, Any]) -> dict[str, str]:
    return dict(node["metadata"].get("annotations") or {})


def _labels(node: dict[str, Any]) -> dict[str, str]:
    return dict(node["metadata"].get("labels") or {})


def rebootable(node: dict[str, Any]) -> bool:
    """rebootableSelector."""
    a = _annotations(node)
    return (
        a.get(REBOOT_NEEDED) == TRUE
        and a.get(REBOOT_PAUSED) != TRUE
        and a.get(REBOOT_OK) != TRUE
        and a.get(REBOOT_IN_PROGRESS) != TRUE
    )


def just_rebooted(node: dict[str, Any]) -> bool:
    """justRebootedSelector."""
    a = _annotations(node)
    return (
        a.get(REBOOT_OK) == TRUE
        and a.get(REBOOT_NEEDED) == FALSE
        and a.get(REBOOT_IN_PROGRESS) == FALSE
    )


def still_rebooting(node: dict[str, Any]) -> bool:
    """stillRebootingSelector."""
    a = _annotations(node)
    return a.get(REBOOT_OK) == TRUE and a.get(REBOOT_NEEDED) == TRUE


@dataclass
class Operator:
    client: Client
    before_reboot_annotations: list[str] = field(default_factory=list)
    after_reboot_annotations: list[str] = field(default_factory=list)
    max_rebooting_nodes: int = 1

    def process(self) -> None:
        self.cleanup_state()
        self._check(AFTER_REBOOT, self.after_reboot_annotations, FALSE)
        self.mark_after_reboot()
        self._check(BEFORE_REBOOT, self.before_reboot_annotations, TRUE)
        self.mark_before_reboot()

    def cleanup_state(self) -> None:
        for node in self.client.nodes():

            def change(node: dict[str, Any]) -> None:
                if BEFORE_REBOOT not in node["metadata"]["labels"] or rebootable(node):
                    return
                del node["metadata"]["labels"][BEFORE_REBOOT]
                for annotation in self.before_reboot_annotations:
                    node["metadata"]["annotations"].pop(annotation, None)

            self.client.update_node_retry(node["metadata"]["name"], change)

    def _check(self, label: str, annotations: list[str], ok_to_reboot: str) -> None:
        """checkReboot: nodes with label=true and every annotation "true"."""
        for node in self.client.nodes():
            if _labels(node).get(label) != TRUE:
                continue
            if any(_annotations(node).get(a) != TRUE for a in annotations):
                continue

            def change(node: dict[str, Any]) -> None:
                node["metadata"]["labels"].pop(label, None)
                for annotation in annotations:
                    node["metadata"]["annotations"].pop(annotation, None)
                node["metadata"]["annotations"][REBOOT_OK] = ok_to_reboot

            self.client.update_node_retry(node["metadata"]["name"], change)

    def mark_after_reboot(self) -> None:
        for node in self.client.nodes():
            if _labels(node).get(AFTER_REBOOT) == TRUE or not just_rebooted(node):
                continue
            self._mark(node["metadata"]["name"], AFTER_REBOOT, self.after_reboot_annotations)

    def mark_before_reboot(self) -> None:
        nodes = self.client.nodes()
        rebooting = [
            n
            for n in nodes
            if still_rebooting(n)
            or _labels(n).get(BEFORE_REBOOT) == TRUE
            or _labels(n).get(AFTER_REBOOT) == TRUE
        ]
        capacity = self.max_rebooting_nodes - len(rebooting)
        wanting = [n for n in nodes if rebootable(n) and _labels(n).get(BEFORE_REBOOT) != TRUE]
        for node in wanting[: max(capacity, 0)]:
            self._mark(node["metadata"]["name"], BEFORE_REBOOT, self.before_reboot_annotations)

    def _mark(self, name: str, label: str, annotations: list[str]) -> None:
        def change(node: dict[str, Any]) -> None:
            for annotation in annotations:
                node["metadata"]["annotations"].pop(annotation, None)
            node["metadata"]["labels"][label] = TRUE

        self.client.update_node_retry(name, change)


@dataclass
class Agent:
    client: Client
    node: str

    def update_engine_staged(self, version: str) -> None:
        """updateStatusCallback with UPDATE_STATUS_UPDATED_NEED_REBOOT."""

        def change(node: dict[str, Any]) -> None:
            node["metadata"]["annotations"].update(
                {
                    STATUS: NEED_REBOOT,
                    LAST_CHECKED: "1786000000",
                    NEW_VERSION: version,
                    REBOOT_NEEDED: TRUE,
                }
            )
            node["metadata"]["labels"][REBOOT_NEEDED] = TRUE

        self.client.update_node_retry(self.node, change)

    def rebooted(self) -> None:
        """The node came back on its new release: process, on the agent's start."""

        def change(node: dict[str, Any]) -> None:
            node["metadata"]["annotations"].update(
                {REBOOT_NEEDED: FALSE, REBOOT_IN_PROGRESS: FALSE}
            )
            node["metadata"]["labels"][REBOOT_NEEDED] = FALSE

        self.client.update_node_retry(self.node, change)

    def may_reboot(self) -> bool:
        """What the agent waits for: reboot-ok=true."""
        node = next(n for n in self.client.nodes() if n["metadata"]["name"] == self.node)
        return _annotations(node).get(REBOOT_OK) == TRUE
