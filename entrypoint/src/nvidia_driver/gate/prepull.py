"""Pre-pull: the staged release's driver image is on the node before the gate lets it reboot.

Once every image the node will pull after the reboot is published, the gate runs a pod pinned
to the node (``spec.nodeName``: no scheduler, no resources to fit) whose one container is that
image's own no-op (``nvidia-driver --version``). When its container has been created, the
kubelet has pulled the image: the gate approves. After the reboot the Operator's driver pod
finds the image there (``imagePullPolicy: IfNotPresent``, the Operator's default) and pulls
nothing.

Why a pod and not the CRI: a pod needs nothing but the API (the kubelet pulls, with the node's
own credentials and registry mirrors), and the gate keeps no host privilege. The pod is kept,
finished, until the node no longer waits for that image: the kubelet's image garbage collector
counts the image of every container the runtime still knows, exited ones included, as in use,
and the kubelet keeps the last exited container of a pod that exists. The gate deletes the
node's pre-pull pods of any other image as soon as it stops asking for them.

The pod meets the ``restricted`` Pod Security level of the gate's namespace: non-root,
no capabilities, read-only root, RuntimeDefault seccomp, no service-account token.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nvidia_driver.gate.kubeapi import ConflictError, KubeAPI, NotFoundError
from nvidia_driver.safetext import ANNOTATION_SHOWN, shown

APP = "nvidia-driver-prepull"
NODE_LABEL = "gpu-driver-container/prepull-node"
IMAGE_ANNOTATION = "gpu-driver-container/prepull-image"
NO_OP = ("nvidia-driver", "--version")  # the image's own command: nothing else runs
NOBODY = 65534
# What the kubelet says while it cannot pull (pkg/kubelet/images: ErrImagePull, ImagePullBackOff,
# ErrImageNeverPull, InvalidImageName; registry errors surface as these).
PULL_FAILURES = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                           "ErrImageNeverPull"})  # fmt: skip
# The waiting reasons of a container on its way (kubelet_pods.go; "" before the kubelet wrote one)
STARTING = frozenset({"", "ContainerCreating", "PodInitializing"})


def pod_name(node: str, image: str) -> str:
    """One pod per node and image: a DNS-1123 name of bounded length."""
    key = f"{node}\x00{image}".encode()
    return f"{APP}-{hashlib.sha256(key).hexdigest()[:16]}"


@dataclass(frozen=True)
class PrePull:
    api: KubeAPI
    namespace: str  # the gate's own
    node: str

    @property
    def _pods(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    def waiting(self, images: Sequence[str], secrets: Sequence[str] = ()) -> str:
        """Why the reboot waits, in one phrase; empty when every image is on the node.

        ``secrets``: the Operator's pull secrets, by name; the kubelet uses those that exist in
        the gate's namespace, and pulls with the node's own credentials without the others."""
        self.forget(keep=images)
        return "; ".join(filter(None, [self._pulled(image, secrets) for image in images]))

    def forget(self, keep: Sequence[str] = ()) -> None:
        """Delete the node's pre-pull pods of images no longer asked for."""
        kept = {pod_name(self.node, image) for image in keep}
        for pod in self.api.list(self._pods, f"{NODE_LABEL}={self.node}"):
            name = str(pod.get("metadata", {}).get("name", ""))
            if name and name not in kept:
                try:
                    self.api.delete(f"{self._pods}/{name}")
                except NotFoundError:
                    continue

    def _pulled(self, image: str, secrets: Sequence[str]) -> str:
        name = pod_name(self.node, image)
        try:
            pod = self.api.get(f"{self._pods}/{name}")
        except NotFoundError:
            # ConflictError: created meanwhile (a restarted gate): read it on the next look.
            with contextlib.suppress(ConflictError):
                self.api.create(self._pods, self._pod(name, image, secrets))
            return f"pulling {image} onto the node"
        waiting, status = _state(pod, image), pod.get("status")
        if waiting and isinstance(status, Mapping) and status.get("phase") == "Failed":
            # The kubelet's admission failed it before any container (OutOfpods, OutOfmemory:
            # kubelet rejectPod): it never pulls, a new pod may get in.
            with contextlib.suppress(NotFoundError):
                self.api.delete(f"{self._pods}/{name}")
            why = shown(f"{status.get('reason', '')}: {status.get('message', '')}", 200)
            return f"the node refused the pod that pulls {image} ({why}); it is made again"
        return waiting

    def _pod(self, name: str, image: str, secrets: Sequence[str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/name": APP, NODE_LABEL: self.node},
                "annotations": {IMAGE_ANNOTATION: image},
            },
            "spec": {
                "nodeName": self.node,
                "restartPolicy": "Never",
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "tolerations": [{"operator": "Exists"}],  # wherever the driver pod runs
                "imagePullSecrets": [{"name": secret} for secret in secrets],
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": NOBODY,
                    "runAsGroup": NOBODY,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [{
                    "name": "pull",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": list(NO_OP),
                    "resources": {"requests": {"cpu": "1m", "memory": "16Mi"},
                                  "limits": {"memory": "64Mi"}},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }],
            },
        }  # fmt: skip


def _state(pod: Mapping[str, Any], image: str) -> str:
    """Empty once the container was created (so the image is on the node); else the wait."""
    status = pod.get("status")
    statuses = status.get("containerStatuses") if isinstance(status, Mapping) else None
    for container in statuses if isinstance(statuses, list) else []:
        state = container.get("state") if isinstance(container, Mapping) else None
        if not isinstance(state, Mapping):
            continue
        if "running" in state or "terminated" in state:
            return ""
        waiting = state.get("waiting")
        if not isinstance(waiting, Mapping):
            continue
        reason = waiting.get("reason", "")
        message = shown(str(waiting.get("message", "")), ANNOTATION_SHOWN)
        if reason in PULL_FAILURES:
            return f"the node cannot pull {image}: {reason}{': ' + message if message else ''}"
        if reason not in STARTING:  # a start failure's own text (kubelet_pods.go, reason cache)
            said = ": ".join(filter(None, (shown(str(reason), ANNOTATION_SHOWN), message)))
            return f"pulling {image} onto the node; the kubelet says: {said}"
    return f"pulling {image} onto the node"
