"""deploy/reboot-gate says what the gate's code expects, and grants no more than it uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import rbac_rules
from gate_manifests import DEPLOY, KUSTOMIZATION, ROOT, kustomization, manifests, patch_files

from gdc.propose import GATE_IMAGE_FILES, moved_gate_image
from gdc.tags import build_image_tags
from gdc.versions import load_versions
from nvidia_driver.gate.main import CACHE
from nvidia_driver.gate.managers import APPROVAL, HELD, POD_LABEL
from nvidia_driver.gate.updateengine import CORE_UID, PREFS, SYSTEM_BUS
from nvidia_driver.settings import REBOOT_GATE_ANNOTATION

DOCS = Path(__file__).resolve().parents[3] / "docs" / "gpu-operator.md"
FOLDERS = sorted(path.name for path in DEPLOY.iterdir() if path.is_dir())
# The build images of versions.toml's drivers: the manifests run one of them by default (not
# necessarily the newest: the drivers workflow moves them only when it replaces theirs).
BUILD_TAGS = {build_image_tags(driver.version, ())[0] for driver in load_versions().drivers}
WORKLOADS = {"DaemonSet", "Deployment"}


def _daemonset(variant: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(
        (DEPLOY / variant / "0500_daemonset.yaml").read_text()
    )
    return document


def _container(variant: str) -> dict[str, Any]:
    [container] = _daemonset(variant)["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _env(variant: str) -> dict[str, Any]:
    return {
        item["name"]: item.get("value", item.get("valueFrom"))
        for item in _container(variant)["env"]
    }


def test_both_variants_run_the_gate_from_the_build_image_on_gpu_nodes() -> None:
    for variant in ("fluo", "kured"):
        spec = _daemonset(variant)["spec"]["template"]["spec"]
        container = _container(variant)
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert container["image"].rsplit(":", 1)[1] in BUILD_TAGS  # a build image we publish
        assert container["command"] == ["nvidia-driver"]
        assert container["args"] == ["reboot-gate", "--manager", variant]
        env = _env(variant)
        assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
        # readOnlyRootFilesystem: tempfile (gpg's home, a decompressor's stderr) needs /tmp.
        assert {m["mountPath"] for m in container["volumeMounts"]} >= {str(CACHE.parent), "/tmp"}
        assert container["securityContext"]["readOnlyRootFilesystem"]
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert "privileged" not in container["securityContext"]


def test_both_variants_tolerate_every_taint_of_a_gpu_node() -> None:
    """A GPU node tainted otherwise (dedicated=gpu:NoSchedule, a cloud's GPU taint) still runs
    the driver pod when the Operator's daemonsets.tolerations lists the taint; a gate pod that
    did not tolerate it left the node with no gate: FLUO's --others skips a node the Operator
    installs a driver on (no verdict, ever) and kured rebooted it unchecked. The nodeSelector
    keeps the gate on GPU nodes; the pre-pull pod tolerates every taint as well."""
    for variant in ("fluo", "kured"):
        tolerations = _daemonset(variant)["spec"]["template"]["spec"]["tolerations"]
        assert tolerations == [{"operator": "Exists"}]


def test_the_fluo_variant_sets_the_annotation_fluo_is_told_to_wait_for() -> None:
    assert _env("fluo")[REBOOT_GATE_ANNOTATION] == APPROVAL
    assert f"--before-reboot-annotations={APPROVAL}" in DOCS.read_text()
    assert _daemonset("fluo")["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"]


def test_the_kured_variant_blocks_from_its_start_and_reaches_update_engine() -> None:
    template = _daemonset("kured")["spec"]["template"]
    assert template["metadata"]["labels"][POD_LABEL] == HELD
    assert f"--blocking-pod-selector={POD_LABEL}={HELD}" in DOCS.read_text()
    assert _env("kured")["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    mounts = {m["name"]: m["mountPath"] for m in _container("kured")["volumeMounts"]}
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert mounts["host-dbus"] == str(SYSTEM_BUS.parent)
    assert volumes["host-dbus"]["hostPath"]["path"] == str(SYSTEM_BUS.parent)
    # where a staged release reported as 0.0.0 is read (update_engine's saved answer)
    assert mounts["update-engine-prefs"] == str(PREFS)
    assert volumes["update-engine-prefs"]["hostPath"]["path"] == str(PREFS)
    # core's uid on Flatcar, whom update_engine's bus policy lets call GetStatus: not root,
    # which the host's systemd and every other service on the bus would obey.
    context = _container("kured")["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"]) == (CORE_UID, CORE_UID)
    assert context["runAsNonRoot"]
    assert context["readOnlyRootFilesystem"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}


def test_the_rbac_grants_what_the_gate_uses_and_nothing_else() -> None:
    granted = {
        (rule.get("namespace", ""), group, resource, verb)
        for rule in rbac_rules("common", "fluo", "kured", "pull-secrets")
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {
        ("", "", "nodes", "get"),
        ("", "", "nodes", "list"),
        ("", "", "nodes", "patch"),
        ("", "nvidia.com", "clusterpolicies", "list"),
        ("", "nvidia.com", "nvidiadrivers", "list"),
        ("", "nvidia.com", "gpuclusters", "list"),
        ("default", "", "events", "create"),  # node events live there
        ("nvidia-reboot-gate", "", "pods", "patch"),  # kured only
        # pre-pull: one pod per node and staged image, in the gate's own namespace
        ("nvidia-reboot-gate", "", "pods", "create"),
        ("nvidia-reboot-gate", "", "pods", "get"),
        ("nvidia-reboot-gate", "", "pods", "list"),
        ("nvidia-reboot-gate", "", "pods", "delete"),
        ("gpu-operator", "", "secrets", "get"),  # pull-secrets only, by name
    }
    [secrets] = [rule for rule in rbac_rules("pull-secrets") if rule["resources"] == ["secrets"]]
    assert secrets["resourceNames"]  # never every secret of the Operator's namespace


def test_the_fluo_variant_approves_the_nodes_without_a_gate_from_one_unprivileged_replica() -> None:
    """FLUO waits for the annotation on every node: the nodes no gate pod runs on are approved
    by a Deployment that may run on any node, restricted and with nothing of the host."""
    deployment = yaml.safe_load((DEPLOY / "fluo" / "0600_deployment.yaml").read_text())
    assert deployment["kind"] == "Deployment"
    assert deployment["spec"]["replicas"] == 1
    template = deployment["spec"]["template"]
    spec = template["spec"]
    [container] = spec["containers"]
    assert "nodeSelector" not in spec
    assert "affinity" not in spec
    assert container["image"] == _container("fluo")["image"]  # no other image to pull
    assert container["args"] == ["reboot-gate", "--manager", "fluo", "--others"]
    env = {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}
    assert env[REBOOT_GATE_ANNOTATION] == APPROVAL
    # its pods are not the DaemonSet's, whose selector must not take them
    daemonset_selector = _daemonset("fluo")["spec"]["selector"]["matchLabels"]
    assert not daemonset_selector.items() <= template["metadata"]["labels"].items()
    assert spec["securityContext"]["runAsNonRoot"]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"]
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert "volumes" not in spec
    assert (
        spec["serviceAccountName"]
        == _daemonset("fluo")["spec"]["template"]["spec"]["serviceAccountName"]
    )


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_folder_s_kustomization_lists_every_manifest_there(folder: str) -> None:
    """``kubectl apply -k`` installs what kustomization.yaml lists: a manifest left out of it
    would never be applied, and one it lists but that is gone fails the whole apply."""
    listed = kustomization(DEPLOY / folder)
    resources = [r for r in listed.get("resources", []) if not (DEPLOY / folder / r).is_dir()]
    files = [*resources, *(path.name for path in patch_files(DEPLOY / folder))]
    assert all((DEPLOY / folder / name).is_file() for name in files), files
    present = {path.name for path in (DEPLOY / folder).glob("*.yaml")} - {KUSTOMIZATION}
    assert sorted(files) == sorted(present)
    assert resources == sorted(resources), "list the manifests in their numbered order"


@pytest.mark.parametrize("variant", ["fluo", "kured"])
def test_the_gate_s_image_is_set_in_one_place(variant: str) -> None:
    """Each variant's kustomization.yaml sets the image (kustomize's images transformer) of
    every container it installs; the manifests name that same image, so they apply as they are
    too, and it is the build image of a driver versions.toml lists."""
    [image] = kustomization(DEPLOY / variant)["images"]
    assert image["newTag"] in BUILD_TAGS, (
        f"{image['newTag']} is no build image of versions.toml's drivers: set one in the newTag: "
        f"line of deploy/reboot-gate/{variant}/kustomization.yaml and the manifests' image lines"
    )
    documents = [yaml.safe_load(path.read_text()) for path in manifests(DEPLOY / variant)]
    pods = [d["spec"]["template"]["spec"] for d in documents if d["kind"] in WORKLOADS]
    containers = [container for pod in pods for container in pod["containers"]]
    assert len(pods) == {"fluo": 2, "kured": 1}[variant]
    assert {c["image"] for c in containers} == {f"{image['name']}:{image['newTag']}"}
    assert image["newName"] == image["name"]
    assert f"kubectl apply -k deploy/reboot-gate/{variant}" in DOCS.read_text()


def _tags(document: dict[str, Any]) -> set[str]:
    """The image tags a kustomization sets or a workload's containers run."""
    pods = [document["spec"]["template"]["spec"]] if document["kind"] in WORKLOADS else []
    return {
        *(image["newTag"] for image in document.get("images", [])),
        *(c["image"].rsplit(":", 1)[1] for pod in pods for c in pod["containers"]),
    }


def test_propose_drivers_moves_every_place_that_names_the_gate_s_image() -> None:
    """invoke propose-drivers moves the gate's image in GATE_IMAGE_FILES when it replaces the
    driver the image is of: every kustomization that sets it and every workload that runs it."""
    documents = {path: yaml.safe_load(path.read_text()) for path in DEPLOY.glob("*/*.yaml")}
    named = {path for path, document in documents.items() if _tags(document)}
    assert named == {ROOT / name for name in GATE_IMAGE_FILES}
    for path in named:
        [tag] = _tags(documents[path])
        text = path.read_text()
        assert _tags(yaml.safe_load(moved_gate_image(text, tag, "1.2.3-flatcar"))) == {
            "1.2.3-flatcar"
        }
        assert moved_gate_image(text, "1.2.3-flatcar", "4.5.6-flatcar") == text
