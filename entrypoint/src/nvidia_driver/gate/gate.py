"""The gate's loop on one node: read what is staged, judge it, say so, and let the reboot go.

Every :attr:`Settings.interval` seconds, :meth:`Gate.step`:

* FLUO: when the operator has labelled the node ``before-reboot=true`` and the gate's approval
  annotation is not ``true`` yet, judges FLUO's ``new-version``: holds (leaves the approval
  unset) or sets it ``true``. FLUO waits for its annotations on every node, and the gate pods
  run on GPU nodes only (where the image's layers already are), so one more gate, a
  Deployment's (``--others``), approves the nodes no gate pod judges: a cluster with no GPU
  node, or no gate pod, still updates.
* kured: asks update_engine what it staged; while nothing is, or the staged release is held,
  its own pod carries ``reboot-gate=held`` (which kured's ``--blocking-pod-selector`` names);
  for a release its image serves, ``open``.

The verdict goes on the node as the :data:`~.managers.VERDICT` annotation and, when it changes,
as an event (``RebootHeld`` or ``RebootAllowed``, in ``default``, as the kubelet's node events)
and a log line. Node writes are merge patches
that carry the resourceVersion of the node they were decided on: on a 409 the node is read
again and the decision remade, so a gate never approves a node that changed under it (FLUO
deleting its annotations, a new release staged).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nvidia_driver.config import flag
from nvidia_driver.errors import DriverError
from nvidia_driver.gate.kubeapi import ConflictError, KubeAPI, namespace, object_name
from nvidia_driver.gate.managers import (
    APPROVAL,
    BEFORE_REBOOT,
    HELD,
    NEW_VERSION,
    OPEN,
    POD_LABEL,
    TRUE,
    VERDICT,
    Manager,
)
from nvidia_driver.gate.operator import GPU_PRESENT, driver_spec, metadata
from nvidia_driver.gate.prepull import PrePull
from nvidia_driver.gate.updateengine import SYSTEM_BUS, read_staged
from nvidia_driver.gate.verdict import Checker, Verdict, allowed, failure, held
from nvidia_driver.log import say, warn
from nvidia_driver.safetext import ANNOTATION_SHOWN, check, shown
from nvidia_driver.settings import (
    NODE_NAME,
    POD_NAME,
    POD_NAMESPACE,
    REBOOT_GATE_ANNOTATION,
    REBOOT_GATE_PREPULL,
)

COMPONENT = "nvidia-reboot-gate"
EVENTS_NAMESPACE = "default"  # where the API server keeps events about cluster-scoped objects
DEFAULT_INTERVAL = 60.0
CONFLICT_RETRIES = 5


@dataclass(frozen=True)
class Settings:
    node_name: str
    manager: Manager
    namespace: str  # the gate pod's: (kured) the pod itself
    pod_name: str = ""  # kured: the pod whose label kured's blocking selector matches
    approval: str = APPROVAL  # FLUO: the annotation listed in --before-reboot-annotations
    interval: float = DEFAULT_INTERVAL
    system_bus: Path = SYSTEM_BUS
    prepull: bool = True  # the staged image onto the node before approving (prepull.py)
    others: bool = False  # FLUO: approve the nodes no gate judges, not node_name (--others)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], manager: Manager, interval: float, *, others: bool = False
    ) -> Settings:
        if others and manager is not Manager.FLUO:
            raise DriverError(
                "--others is for FLUO: kured's blocking pods hold only their own node, so "
                "nodes without a gate reboot without one"
            )
        settings = cls(
            node_name=env.get(NODE_NAME, "").strip(),
            manager=manager,
            namespace=env.get(POD_NAMESPACE, "").strip(),
            pod_name=env.get(POD_NAME, "").strip(),
            approval=env.get(REBOOT_GATE_ANNOTATION, "").strip() or APPROVAL,
            interval=interval,
            prepull=flag(env, REBOOT_GATE_PREPULL, default=True),
            others=others,
        )
        needed = {POD_NAMESPACE: settings.namespace}
        if not others:
            needed[NODE_NAME] = settings.node_name
        if manager is Manager.KURED:
            needed[POD_NAME] = settings.pod_name
        unset = [name for name, value in needed.items() if not value]
        if unset:
            raise DriverError(
                f"{', '.join(unset)} unset: the gate's DaemonSet sets them from the downward API "
                "(deploy/reboot-gate); set them when running it by hand"
            )
        # They reach request paths, annotations, events and log lines.
        fix = "set it to the Kubernetes name deploy/reboot-gate gives it"
        check(settings.approval, REBOOT_GATE_ANNOTATION, fix)
        for name, value in needed.items():
            (namespace if name == POD_NAMESPACE else object_name)(value, name, fix)
        return settings


@dataclass
class Gate:
    settings: Settings
    api: KubeAPI
    checker: Checker
    prepull: PrePull | None = None
    status: Callable[[Path], str] = read_staged
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    _said: str = ""  # the last verdict reported as an event and a log line
    _label: str = ""  # kured: the value the gate last gave its pod's label

    @property
    def _node_path(self) -> str:
        return f"/api/v1/nodes/{self.settings.node_name}"

    def step(self) -> Verdict | None:
        """One look at the node; the verdict, or None when there is nothing to decide."""
        if self.settings.others:
            self._approve_other_nodes()
            return None
        if self.settings.manager is Manager.FLUO:
            return self._fluo_own()
        return self._kured()

    def run(self, stop: threading.Event) -> None:
        """Look every interval until ``stop`` is set."""
        where = "the nodes no gate pod judges" if self.settings.others else "node"
        say(f"Reboot gate for {where} {self.settings.node_name} ({self.settings.manager})")
        if self.settings.manager is Manager.KURED:
            self._pod_label(HELD)  # a restarted gate holds until it has looked again
        while not stop.is_set():
            self.look()
            stop.wait(self.settings.interval)

    def look(self) -> Verdict | None:
        """:meth:`step`, where a step that fails holds the reboot and says why in one line."""
        try:
            return self.step()
        except Exception as exc:  # noqa: BLE001 - whatever failed, the reboot stays held
            line = failure(exc)
        warn(f"reboot gate: {line}; the reboot stays held")
        if self.settings.manager is Manager.KURED:
            try:
                self._pod_label(HELD)  # a failed step never leaves an earlier "open"
            except DriverError as exc:
                warn(f"reboot gate: cannot label its pod held: {failure(exc)}")
        return held(line)

    # --- FLUO ------------------------------------------------------------------------------

    def _approve_other_nodes(self) -> None:
        """Approve the nodes FLUO asks about that no gate pod judges: those without GPUs, and
        GPU nodes the Operator installs no driver on. FLUO waits for the annotation on every
        node it picks, so without this a cluster with no gate pod stops updating."""
        for node in self.api.list("/api/v1/nodes", f"{BEFORE_REBOOT}={TRUE}"):
            if metadata(node, "annotations").get(self.settings.approval) == TRUE:
                continue
            if metadata(node, "labels").get(GPU_PRESENT) != TRUE:
                verdict = allowed(f"not a GPU node (no {GPU_PRESENT}=true label)")
            else:
                spec = driver_spec(self.api, node)
                if not isinstance(spec, str):
                    continue  # the Operator installs a driver: the node's own gate judges it
                verdict = allowed(spec)
            name = str(node.get("metadata", {}).get("name", ""))
            try:
                patch = {VERDICT: verdict.text, self.settings.approval: TRUE}
                self._annotate(f"/api/v1/nodes/{name}", node, patch)
            except ConflictError:
                continue  # changed meanwhile (FLUO's cleanup): the next look decides again
            say(f"Reboot allowed for node {shown(name, 253)}: {verdict.line}")

    def _fluo_own(self) -> Verdict | None:
        for _ in range(CONFLICT_RETRIES):
            node = self.api.get(self._node_path)
            labels, annotations = metadata(node, "labels"), metadata(node, "annotations")
            if labels.get(BEFORE_REBOOT) != TRUE:
                return None  # FLUO is not asking (any more)
            if annotations.get(self.settings.approval) == TRUE:
                return None  # approved already; FLUO removes the label next
            verdict = self._pulled(self.checker.verdict(node, annotations.get(NEW_VERSION, "")))
            patch = {VERDICT: verdict.text}
            if verdict.allowed:
                patch[self.settings.approval] = TRUE
            try:
                if patch != {VERDICT: annotations.get(VERDICT)}:
                    self._annotate(self._node_path, node, patch)
            except ConflictError:
                continue  # the node changed since: look again, decide again
            self._report(verdict)
            return verdict
        raise DriverError(f"node {self.settings.node_name} kept changing under the gate")

    # --- kured -----------------------------------------------------------------------------

    def _kured(self) -> Verdict:
        staged = self.status(self.settings.system_bus)
        for _ in range(CONFLICT_RETRIES):
            node = self.api.get(self._node_path)
            if not staged:
                verdict = held("no Flatcar release is staged (update_engine waits for no reboot)")
            else:
                verdict = self._pulled(self.checker.verdict(node, staged))
            if not verdict.allowed:
                self._pod_label(HELD)  # before the node says why: held is never late
            try:
                if metadata(node, "annotations").get(VERDICT) != verdict.text:
                    self._annotate(self._node_path, node, {VERDICT: verdict.text})
            except ConflictError:
                continue
            if verdict.allowed:
                self._pod_label(OPEN)
            if staged or self._said:  # nothing staged since the start: nothing to tell
                self._report(verdict)
            return verdict
        raise DriverError(f"node {self.settings.node_name} kept changing under the gate")

    def _pod_label(self, value: str) -> None:
        if value == self._label:
            return
        path = f"/api/v1/namespaces/{self.settings.namespace}/pods/{self.settings.pod_name}"
        self.api.merge_patch(path, {"metadata": {"labels": {POD_LABEL: value}}})
        self._label = value

    def _pulled(self, verdict: Verdict) -> Verdict:
        """An allowed verdict stands once the node has pulled its images; until then it holds."""
        if not (verdict.allowed and verdict.pull and self.prepull is not None):
            return verdict
        waiting = self.prepull.waiting(verdict.pull, verdict.pull_secrets)
        if waiting:
            return held(f"{verdict.line}; {waiting}")
        return allowed(f"{verdict.line}; on the node", verdict.pull, verdict.pull_secrets)

    # --- the node: annotation and event ----------------------------------------------------

    def _annotate(self, path: str, node: Mapping[str, Any], annotations: Mapping[str, str]) -> None:
        """Merge annotations into the node as it was read: a 409 if it changed since."""
        version = node.get("metadata", {}).get("resourceVersion", "")
        patch = {"metadata": {"resourceVersion": version, "annotations": dict(annotations)}}
        self.api.merge_patch(path, patch)

    def _report(self, verdict: Verdict) -> None:
        if verdict.text == self._said:
            return
        self._said = verdict.text
        say(f"Reboot {'allowed' if verdict.allowed else 'held'}: {verdict.line}")
        now = self.clock()
        name = self.settings.node_name
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            # A Node has no namespace: the API server takes an Event about it only in default
            # (k8s pkg/apis/core/validation/events.go legacyValidateEvent), as the kubelet's.
            "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": EVENTS_NAMESPACE},
            # uid = the node's name, as the kubelet's node events have it: kubectl describe
            # node looks events up so (kubernetes pkg/kubelet NodeRecorder, kubectl describe).
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": name, "uid": name},
            "reason": "RebootAllowed" if verdict.allowed else "RebootHeld",
            "message": verdict.line,
            "type": "Normal" if verdict.allowed else "Warning",
            "source": {"component": COMPONENT, "host": name},
            "reportingComponent": COMPONENT,
            "reportingInstance": name,
            "firstTimestamp": f"{now:%Y-%m-%dT%H:%M:%SZ}",
            "lastTimestamp": f"{now:%Y-%m-%dT%H:%M:%SZ}",
            "count": 1,
        }
        try:
            self.api.create(f"/api/v1/namespaces/{EVENTS_NAMESPACE}/events", event)
        except DriverError as exc:  # the annotation says it already
            warn(f"reboot gate: cannot record the event: {shown(str(exc), ANNOTATION_SHOWN)}")
