"""The verdict on one staged release for one node: may it reboot into it, and why (one line).

1. The policy: the ClusterPolicy, or the node's NVIDIADriver (:mod:`.operator`); none, or one
   that installs no driver, lets the reboot go.
2. The release's kernel, from Flatcar's releases feed (``FLATCAR_RELEASES_URL``); a release the
   feed does not list yet is held: the per-kernel tags and the build check need its kernel.
3. With ``usePrecompiled`` under a ClusterPolicy, a staged kernel that another GPU node runs on
   another release is held: the Operator refuses such a cluster (:func:`.operator.shared_kernel`).
4. The images the Operator may ask for on that release (:func:`.operator.wanted_images`), each
   looked up in its registry for every arch that would pull it, with the Operator's pull
   secrets.
5. Where a node would build at runtime (the build image, a digest, or a ClusterPolicy's
   precompiled image of another release), whether the build can serve the kernel
   (:mod:`.buildcheck`).

Whatever cannot be checked (the API, a registry or the feed failing) holds the reboot, and the
line says what failed: the gate fails closed.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nvidia_driver import limits
from nvidia_driver.errors import DriverError
from nvidia_driver.formats import jsontext
from nvidia_driver.formats.oci import Credentials, kubelet_keyring
from nvidia_driver.gate.buildcheck import BuildImage, Outcome
from nvidia_driver.gate.kubeapi import KubeAPI, object_name
from nvidia_driver.gate.operator import DriverSpec as Spec
from nvidia_driver.gate.operator import (
    GPUNode,
    Kind,
    Wanted,
    driver_spec,
    gpu_nodes,
    node_arch,
    shared_kernel,
    wanted_images,
)
from nvidia_driver.gate.registry import ImageRef, Presence, Registry
from nvidia_driver.gate.updateengine import PREFS, VERSION_ZERO, staged_from_prefs
from nvidia_driver.safetext import ANNOTATION_SHOWN, shown
from nvidia_driver.sources.download import Downloader
from nvidia_driver.sources.flatcar import FlatcarVersion, Release, parse_releases

SHOWN = 3  # missing images named in the line; the rest are counted
# A pull secret's type -> the key the kubelet reads (k8s.io/api core/v1 types.go)
PULL_SECRET_KEYS = {"kubernetes.io/dockerconfigjson": ".dockerconfigjson",
                    "kubernetes.io/dockercfg": ".dockercfg"}  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    line: str  # one line, for the node's annotation, its event and the log
    # allowed: the images the node pulls after the reboot (what a verdict says is its line)
    pull: tuple[str, ...] = field(default=(), compare=False)
    pull_secrets: tuple[str, ...] = field(default=(), compare=False)  # the Operator's, by name

    @property
    def text(self) -> str:
        return f"{'allowed' if self.allowed else 'held'}: {self.line}"


def held(line: str) -> Verdict:
    """A held verdict; its line is made one line here, whatever the cluster put in it."""
    return Verdict(allowed=False, line=shown(line, ANNOTATION_SHOWN))


def allowed(line: str, pull: tuple[str, ...] = (), pull_secrets: tuple[str, ...] = ()) -> Verdict:
    return Verdict(allowed=True, line=shown(line, ANNOTATION_SHOWN), pull=pull,
                   pull_secrets=pull_secrets)  # fmt: skip


@dataclass
class Releases:
    """The releases feed, read when a release is asked for that it has not listed yet."""

    url: str
    downloader: Downloader
    _known: dict[FlatcarVersion, Release] = field(default_factory=dict)

    def find(self, version: FlatcarVersion) -> Release | None:
        if version not in self._known:
            text = self.downloader.get_text(self.url, limits.FEED, "Flatcar's releases feed")
            feed = jsontext.parse(text, "Flatcar's releases feed")
            self._known = {release.version: release for release in parse_releases(feed)}
        return self._known.get(version)


@dataclass
class Checker:
    api: KubeAPI
    releases: Releases
    build: BuildImage
    operator_namespace: str
    # One per gate process: its tokens and verdicts are reused from look to look.
    registry: Registry = field(default_factory=Registry)
    prefs: Path = PREFS  # update_engine's, where a staged release of 0.0.0 is looked up

    def verdict(self, node: Mapping[str, Any], staged: str) -> Verdict:
        if staged == VERSION_ZERO:  # a release that cannot be real: never looked up in the feed
            try:
                staged = staged_from_prefs(self.prefs)
            except DriverError as exc:
                return held(
                    f"flatcar {VERSION_ZERO}: update_engine reports no staged release "
                    f"({VERSION_ZERO}: it was restarted since it staged one), and {exc}: the "
                    "gate cannot tell which release waits; the kured variant reads it from the "
                    f"host's {PREFS}"
                )
        try:
            version = FlatcarVersion.parse(staged)
        except DriverError:
            return held(f"the staged release '{shown(staged, 60)}' is not a Flatcar version: "
                        "cannot tell which image it needs")  # fmt: skip
        prefix = f"flatcar {version}"
        try:
            return self._verdict(node, version, prefix)
        except Exception as exc:  # noqa: BLE001 - whatever the answers were, the gate holds
            return held(f"{prefix}: cannot check its driver image: {failure(exc)}")

    def _verdict(self, node: Mapping[str, Any], version: FlatcarVersion, prefix: str) -> Verdict:
        spec = driver_spec(self.api, node)
        if isinstance(spec, str):
            return allowed(f"{prefix}: {spec}")
        release = self.releases.find(version)
        if release is None:
            feed = shown(self.releases.url, 120)
            return held(f"{prefix}: not in Flatcar's releases feed ({feed}) yet, so its kernel "
                        "is unknown")  # fmt: skip
        arch = node_arch(node)
        name = str(node.get("metadata", {}).get("name", ""))
        after = GPUNode(name, str(version), release.kernel_release, arch)
        others = [] if spec.per_pool else gpu_nodes(self.api)
        refused = shared_kernel(spec, after, others)
        if refused:
            return held(f"{prefix}: {refused}")
        wanted = wanted_images(spec, after, others)
        problems = _counted(self._unpublished(spec, wanted))
        build = self._build(spec, str(version), arch, release.kernel_release)
        if build.problem:
            problems.append(build.problem)
        if problems:
            return held(f"{prefix}: {'; '.join(problems)}")
        said = _counted([image.reference for image in wanted])
        said = [f"{', '.join(said)} published"] if wanted else [f"{spec.source} names a digest"]
        if build.note:
            said.append(build.note)
        # What this node pulls after the reboot: its arch's wanted images (for a digest, the
        # one image every release runs, which it has already).
        pull = tuple(image.reference for image in wanted if arch in image.arches)
        return allowed(f"{prefix}: {'; '.join(said)}", pull, spec.pull_secrets)

    def _unpublished(self, spec: Spec, wanted: list[Wanted]) -> list[str]:
        """What is missing of the wanted images, one phrase each."""
        credentials = self._credentials(spec)
        missing: list[str] = []
        for image in wanted:
            for pulling in sorted(image.arches):
                reference = ImageRef.parse(image.reference)
                presence = self.registry.presence(reference, pulling, credentials)
                if presence is Presence.MISSING:
                    missing.append(f"{image.reference} not published yet")
                    break
                if presence is Presence.NO_ARCH:
                    missing.append(f"{image.reference} has no linux/{pulling} image")
        return missing

    def _build(self, spec: Spec, version: str, arch: str, kernel: str) -> Outcome:
        """The runtime build's outcome where a node on the release would build at runtime."""
        runs_build_image = spec.kind in {Kind.BUILD, Kind.DIGEST}
        other_release = spec.kind is Kind.PRECOMPILED and not spec.per_pool
        if not (runs_build_image or other_release):
            return Outcome()  # the per-release or per-kernel image carries the packages
        own = self.build.driver_version
        if spec.kind is Kind.BUILD and spec.driver != own:
            return Outcome(
                problem=f"the gate runs the build image of driver {own or 'none'}, the "
                f"{spec.source} names {shown(spec.driver or spec.version, 60)}: run the "
                "gate from the cluster's build image so it can check that image's compilers"
            )
        driver = spec.driver or own  # a digest: the gate's own image, as the docs require
        if not driver:
            return Outcome(problem="the gate runs in no build image (no DRIVER_VERSION), so it "
                                   "cannot check a runtime build")  # fmt: skip
        outcome = self.build.sources_build(driver, version, arch, kernel)
        if outcome.problem or not runs_build_image:
            return outcome
        return self.build.compilers(version, arch)

    def _credentials(self, spec: Spec) -> list[tuple[str, Credentials]]:
        """The keyring of the Operator's pull secrets, in their order, as the kubelet reads them
        (kubernetes v1.36 pkg/credentialprovider/secrets/secrets.go): by the key of the secret's
        type; one of another type, or whose key is empty, is no pull secret and gives none."""
        found: list[tuple[str, Credentials]] = []
        for name in spec.pull_secrets:
            object_name(name, "pull secret", f"correct imagePullSecrets in {spec.source}")
            path = f"/api/v1/namespaces/{self.operator_namespace}/secrets/{name}"
            secret = self.api.get(path)
            key = PULL_SECRET_KEYS.get(str(secret.get("type")), "")
            encoded = secret.get("data", {}).get(key, "") if key else ""
            if not encoded:
                continue
            what = f"pull secret {self.operator_namespace}/{shown(name, 60)}"
            try:
                decoded = base64.b64decode(encoded)
            except (binascii.Error, ValueError):
                raise DriverError(f"{what} holds no base64") from None
            document = jsontext.parse(decoded, what)
            found.extend(kubelet_keyring(document, what, dockercfg=key == ".dockercfg"))
        return found


def failure(exc: Exception) -> str:
    """What a failed check says: a DriverError's line, or the shape of an answer nobody
    expected (a list where an object was, a field of the wrong type), never a traceback."""
    if isinstance(exc, DriverError):
        return shown(str(exc), ANNOTATION_SHOWN)
    why = shown(f"{type(exc).__name__}: {exc}", 200)
    return f"an answer of a shape the gate does not read ({why})"


def _counted(phrases: list[str]) -> list[str]:
    """The first :data:`SHOWN` phrases, and how many more there are."""
    more = len(phrases) - SHOWN
    return phrases[:SHOWN] + ([f"and {more} more"] if more > 0 else [])
