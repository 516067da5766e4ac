"""The reboot managers the gate works with, and the names they and the gate use on a node.

FLUO (flatcar/flatcar-linux-update-operator 8dd83d7, ``pkg/constants/constants.go`` and
``pkg/operator/operator.go``), for every node whose agent asks for a reboot:

1. the agent sets ``reboot-needed=true`` (annotation and label) and ``new-version`` (the
   staged release, update_engine's NewVersion) when update_engine reports
   ``UPDATE_STATUS_UPDATED_NEED_REBOOT`` (``pkg/agent/agent.go`` ``updateStatusCallback``);
2. the operator picks up to ``maxRebootingNodes`` (1) of them (``markBeforeReboot``), deletes
   the annotations listed in ``--before-reboot-annotations`` and labels the node
   ``before-reboot=true``: a node so labelled counts as rebooting, so it halts the others;
3. the hooks (a DaemonSet whose nodeSelector is that label: this gate) check, and each sets its
   annotation to ``true``;
4. once all are ``true`` the operator (``checkBeforeReboot``) removes the label and those
   annotations and sets ``reboot-ok=true``; the agent drains and reboots. A node that no longer
   wants to reboot loses the label and the annotations (``cleanupState``).

kured (kubereboot/kured 51220cc, ``cmd/kured/main.go`` ``rebootAsRequired``,
``pkg/blockers/kubernetespod.go``) reboots a node when its sentinel (``/run/reboot-required``,
which Flatcar's update_engine postinst touches) exists, unless a blocker says no. Of its
blockers the gate uses ``--blocking-pod-selector``: a pod on the node that matches the selector
and has not ended blocks the reboot, and a failed pod query blocks it too. The gate's pod
carries :data:`POD_LABEL` ``=held`` from its template, so a gate pod blocks until it has checked,
and sets it to ``open`` only for a staged release its image serves. kured's other blockers do
not fit: its Prometheus alerts block every node of the cluster at once, and its sentinel
command decides whether a reboot is *needed*, run in kured's own container or the host's mount
namespace, where the gate does not live.
"""

from __future__ import annotations

from enum import StrEnum


class Manager(StrEnum):
    FLUO = "fluo"
    KURED = "kured"


FLUO_PREFIX = "flatcar-linux-update.v1.flatcar-linux.net/"
BEFORE_REBOOT = FLUO_PREFIX + "before-reboot"  # label, set "true" by the operator
NEW_VERSION = FLUO_PREFIX + "new-version"  # annotation, set by the agent
REBOOT_NEEDED = FLUO_PREFIX + "reboot-needed"  # annotation and label, set by the agent
REBOOT_OK = FLUO_PREFIX + "reboot-ok"  # annotation, set by the operator
TRUE = "true"

# The gate's own names (a DNS label as prefix: this project owns no domain).
GATE_PREFIX = "gpu-driver-container/"
# FLUO: the annotation the gate sets "true"; list it in the operator's --before-reboot-annotations.
APPROVAL = GATE_PREFIX + "reboot-gate-ok"
# Both: the gate's verdict on the node, one line ("held: ..." or "allowed: ...").
VERDICT = GATE_PREFIX + "reboot-gate"
# kured: the gate pod's label; kured's --blocking-pod-selector is POD_LABEL=HELD.
POD_LABEL = GATE_PREFIX + "reboot-gate"
HELD, OPEN = "held", "open"
