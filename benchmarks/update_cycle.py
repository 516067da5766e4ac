"""A GPU node's whole Flatcar update, with and without the gate's pre-pull (needs root).

The update cycle, run twice side by side in one run, each time on a node whose container
runtime lacks the staged release's image:

1. update_engine has staged release N+1; FLUO has picked the node (its ``before-reboot`` label
   and ``new-version`` annotation, as in tests/integration/cluster/test_reboot_gate.py);
2. the gate (``nvidia-driver reboot-gate --manager fluo --once``, with deploy/reboot-gate's
   ServiceAccount, against a real kube-apiserver and the GPU Operator's CRDs) holds: the
   image the NVIDIADriver (``usePrecompiled``) names for N+1 is not published;
3. the image is published (``docker push`` to Debian's docker-registry on 127.0.0.1);
4. with pre-pull, the gate runs its pre-pull pod; the node pulls the image (the project's
   dockerd stands in for the node's runtime; the pod's status is written as a kubelet would,
   tests/integration/cluster/gate.py ``kubelet_pulled``); without (``REBOOT_GATE_PREPULL=false``)
   it approves at once;
5. the gate approves; the node reboots: the driver pod starts on release N+1's node directory
   (the integration harness, fixtures/daemonset.py: the Operator's privileges, env, command
   and mounts; only the GPU and module loading are stood in for), pulling first what the
   runtime lacks (``imagePullPolicy: IfNotPresent``, the Operator's default);
6. Ready: the driver container's "Done, now waiting for signal".

Printed: the time from the reboot to Ready (the kubelet starting the driver pod; the
node's own boot and the kubelet's registration come before it and are the same either way,
and on a GPU node module loading and the fabric manager's start add seconds stood in for
here), measured here (the registry on loopback) and at
LINK_BITS_PER_SECOND (the bytes pulled after the reboot over the link, then their decompression
measured on one core, as image_sizes computes it); the bytes pulled after the reboot, read from
the registry's own access log. The goal (issue 37): Ready <= 60 s after the reboot on a 1 Gbit/s
node, with 0 bytes pulled after it.

The node before the reboot holds release N's precompiled image. It shares every layer but its
packages layer with the build image (image_sizes; test_images.py), and that layer is release
N's, so here the node holds the build image: what it lacks of N+1's image is the same one layer.
Layers go as dockerd pushes them (gzip); ``invoke publish``'s zstd layers are smaller
(image_sizes). Release N's own driver pod is not run: its stop is not part of the time after
the reboot.

Without ``--build-image`` and ``--precompiled-image`` both images are built first, as the
integration tests build them (fixtures/images.py: the 535.261.03 fixture driver, the test
release 9999.2.0), which takes a while. The kube-apiserver and the GPU Operator's module come
from tests/integration/cluster/peers.toml (built into the cache unless there).

Usage (root; the venv of ``nox -s integration``):
  .nox/integration/bin/python benchmarks/update_cycle.py [--build-image REF
      --precompiled-image REF] [--record]
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

# In the venv `nox -s integration` made: the fixtures, the cluster session's helpers, what
# they share with the unit tests, the tooling and this checkout's entrypoint.
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "entrypoint" / "src"))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "tooling"))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "tests" / "shared"))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "tests/integration/cluster"))

import peers
from apiserver import Cluster, running_cluster
from fixtures.daemonset import HGX_H100, READY_LINE, Node, docker, driver_pod, image_packages
from fixtures.docker_env import Registry, local_registry, remove_images
from fixtures.flatcar import feed_bytes, releases_feeds
from fixtures.http_server import FaultyHTTPServer, Route
from fixtures.images import DRIVER
from fixtures.release_server import TEST_RELEASE
from gate import gate_env, install, kubelet_pulled, run_gate_once
from gpu_operator import NAMESPACE as OPERATOR_NAMESPACE
from gpu_operator import flatcar_node, install_crds, nvidia_driver, register_node
from image_sizes import (
    LINK_BITS_PER_SECOND,
    MB,
    Pushed,
    image_arguments,
    image_parser,
    images,
    read_pushed,
)
from record import REPOSITORY, Report

from nvidia_driver.gate.managers import APPROVAL, BEFORE_REBOOT, NEW_VERSION, VERDICT
from nvidia_driver.sources.flatcar import FlatcarVersion, parse_releases
from nvidia_driver.sources.gpuoperator import precompiled_tag

SHOWN = 100  # characters of a verdict printed
READY_GOAL_SECONDS = 60.0
BYTES_AFTER_REBOOT_GOAL = 0
RUNNING, RUNNING_KERNEL = "9999.1.0", "6.12.54-flatcar"  # release N: the gate reads only
# the staged release's kernel (and "+" is no label value: the NFD label of N+1's would differ)
BRANCH = DRIVER.split(".")[0]  # NVIDIADriver's version with usePrecompiled: the branch
# One line of the registry's access log: a blob GET and the bytes it sent, by the docker client.
# docker-registry wraps its handler in gorilla/handlers' CombinedLoggingHandler on stdout unless
# log.accesslog.disabled (distribution/distribution registry/registry.go), as seen in the test
# registries' logs: 127.0.0.1 - - [date] "GET /v2/<name>/blobs/<digest> HTTP/1.1" 200 <bytes> ...
BLOB_GET = re.compile(r'"GET /v2/\S+/blobs/(sha256:[0-9a-f]{64}) HTTP/[0-9.]+" 200 (\d+) '
                      r'"[^"]*" "docker/')  # fmt: skip


@dataclass
class Cycle:
    """One node's update, as the benchmark saw it."""

    prepull: bool
    steps: list[tuple[str, float]] = field(default_factory=list)  # what happened, seconds in
    pulled_before: dict[str, int] = field(default_factory=dict)  # blob digest -> bytes
    pulled_after: dict[str, int] = field(default_factory=dict)
    pull_after_seconds: float = 0.0  # the pull after the reboot, on loopback
    ready_seconds: float = 0.0  # reboot to Ready, on loopback

    def at_link(self, pushed: Pushed) -> float:
        """Reboot to Ready had the bytes after the reboot come over the link."""
        layers = tuple(layer for layer in pushed.layers if layer.digest in self.pulled_after)
        return self.ready_seconds - self.pull_after_seconds + pushed.pull_seconds(layers)


class AccessLog:
    """The registry's access log, read from where the last look stopped."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, path.stat().st_size

    def blobs_pulled(self) -> dict[str, int]:
        with self.path.open("rb") as log:
            log.seek(self.offset)
            text = log.read().decode(errors="replace")
            self.offset = log.tell()
        pulled: dict[str, int] = {}
        for match in BLOB_GET.finditer(text):
            pulled[match[1]] = pulled.get(match[1], 0) + int(match[2])
        return pulled


@dataclass(frozen=True)
class Setting:
    """What both cycles share."""

    cluster: Cluster
    registry: Registry
    log: AccessLog
    feed: str  # the releases feed's URL
    kernel: str  # the staged release's, as the feed lists it
    banner: str  # /proc/version of the staged release's kernel, as the image's packages say
    precompiled: str  # the image, on the project's dockerd (the node's runtime)
    workdir: Path


def image_tags(reference: str) -> list[str]:
    listed = docker("image", "inspect", "--format", "{{range .RepoTags}}{{.}} {{end}}",
                    reference).stdout  # fmt: skip
    return listed.split()


def present(reference: str) -> bool:
    return docker("image", "inspect", reference, check=False).returncode == 0


def staged_kernel(feed: bytes) -> str:
    """The staged release's kernel as the gate reads it: from the releases feed."""
    wanted = FlatcarVersion.parse(TEST_RELEASE.version)
    (release,) = [r for r in parse_releases(feed.decode()) if r.version == wanted]
    return release.kernel_release


@contextmanager
def feed_server(feed: bytes) -> Iterator[str]:
    with FaultyHTTPServer({"/releases.json": Route(feed, "application/json")}) as server:
        yield f"{server.url}/releases.json"


def gate_says(setting: Setting, env: dict[str, str], node: str) -> str:
    """One look of the gate; its verdict, "approved: ..." when it approved."""
    cluster = setting.cluster
    result = run_gate_once(cluster, env, setting.workdir)
    if result.returncode != 0:
        raise RuntimeError(f"the gate failed on {node}:\n{result.stderr}")
    annotations = cluster.get(f"/api/v1/nodes/{node}")["metadata"].get("annotations") or {}
    verdict = str(annotations.get(VERDICT, ""))
    return f"approved: {verdict}" if annotations.get(APPROVAL) == "true" else verdict


def staged_node(setting: Setting, name: str, repository: str, *, prepull: bool) -> dict[str, str]:
    """The node FLUO picked, its NVIDIADriver; the environment of its gate."""
    module = peers.module_dir(peers.load()["gpu-operator"])
    driver = nvidia_driver(module, name, repository, BRANCH, name)
    driver["spec"]["usePrecompiled"] = True
    setting.cluster.apply(driver)
    node = flatcar_node(name, RUNNING, RUNNING_KERNEL)
    node["metadata"]["labels"][BEFORE_REBOOT] = "true"  # FLUO's operator picked it
    node["metadata"]["annotations"][NEW_VERSION] = TEST_RELEASE.version  # FLUO's agent
    register_node(setting.cluster, node)
    (setting.workdir / name).mkdir()
    env = gate_env(setting.cluster, name, setting.feed, setting.workdir / name)
    env["PYTHONPATH"] = str(REPOSITORY / "entrypoint" / "src")  # this checkout's gate
    if not prepull:
        env["REBOOT_GATE_PREPULL"] = "false"
    return env


def kubelet_pulls(setting: Setting, node: str, image: str) -> dict[str, int]:
    """The node's runtime pulls the pre-pull pod's image, and the pod's status says so, as the
    kubelet writes it; the blobs it pulled."""
    docker("pull", image, timeout=1800)
    pulled = setting.log.blobs_pulled()
    asked = kubelet_pulled(setting.cluster, node)
    if asked != [image]:
        raise RuntimeError(f"the pre-pull pods asked for {asked}, not {image}")
    return pulled


def run_cycle(setting: Setting, run: int, *, prepull: bool) -> Cycle:
    """One node's update, from staged to Ready. Each cycle has a node and a repository of its
    own, so the staged release's image is unpublished when it starts."""
    cycle = Cycle(prepull)
    name = f"gpu-update-{'prepull' if prepull else 'plain'}-{run}"
    repository = f"{setting.registry.address}/{name}"
    wanted = precompiled_tag(f"{repository}/driver:{BRANCH}", setting.kernel,
                             TEST_RELEASE.version)  # fmt: skip
    env = staged_node(setting, name, repository, prepull=prepull)
    tags = image_tags(setting.precompiled)
    started = time.monotonic()

    def step(what: str) -> None:
        cycle.steps.append((what, time.monotonic() - started))

    held = gate_says(setting, env, name)
    if not held.startswith("held"):
        raise RuntimeError(f"the gate did not hold before the image was published: {held}")
    step(f"gate holds: {held[:SHOWN]}")
    docker("tag", setting.precompiled, wanted)
    docker("push", wanted, timeout=1800)
    step("image published (docker push)")
    # The node's runtime never had it: every tag of the image goes, its packages layer with it.
    remove_images(*image_tags(wanted))
    if present(wanted):
        raise RuntimeError(f"{wanted} is still on the node (a container holds it?)")
    setting.log.blobs_pulled()  # the push's own requests are not a node's pulls
    verdict = gate_says(setting, env, name)
    if prepull:
        if verdict.startswith("approved"):
            raise RuntimeError(f"the gate approved before the pre-pull: {verdict}")
        step("gate runs its pre-pull pod")
        cycle.pulled_before = kubelet_pulls(setting, name, wanted)
        step(f"node has pulled it ({sum(cycle.pulled_before.values()) / MB:.1f} MB)")
        verdict = gate_says(setting, env, name)
    if not verdict.startswith("approved"):
        raise RuntimeError(f"the gate did not approve once the image was there: {verdict}")
    step(verdict[:SHOWN])

    # Release N+1's node: the harness's kernel (the feed names it by its upstream version).
    after = Node(setting.banner, TEST_RELEASE.kernel.release, TEST_RELEASE.os_release(),
                 HGX_H100)  # fmt: skip
    rebooted = time.time()
    step("reboot")
    if not present(wanted):  # the kubelet pulls only what the runtime lacks (IfNotPresent)
        docker("pull", wanted, timeout=1800)
        cycle.pull_after_seconds = time.time() - rebooted
    cycle.pulled_after = setting.log.blobs_pulled()
    with driver_pod(wanted, after) as pod:
        cycle.ready_seconds = pod.wait_for(READY_LINE) - rebooted
        step("Ready")
        if pod.stop() != 0:
            raise RuntimeError(f"the driver pod did not stop cleanly:\n{pod.output}")
    for tag in tags:  # the caller's image as it was
        docker("tag", wanted, tag)
    return cycle


def median_cycle(cycles: list[Cycle], pushed: Pushed) -> Cycle:
    """The run whose time to Ready at the link is the median."""
    return sorted(cycles, key=lambda cycle: cycle.at_link(pushed))[len(cycles) // 2]


def print_figures(cycles: dict[bool, list[Cycle]], pushed: Pushed) -> bool:
    rate = LINK_BITS_PER_SECOND / 1e9
    with_prepull = median_cycle(cycles[True], pushed)
    without = median_cycle(cycles[False], pushed)
    print("the cycle with pre-pull (seconds from the gate's first look; the median run):")
    for what, seconds in with_prepull.steps:
        print(f"  {seconds:7.1f} s  {what}")
    runs = len(cycles[True])
    print(f"reboot to Ready, median of {runs} runs each, measured (registry on loopback) and "
          f"at {rate:g} Gbit/s:")  # fmt: skip
    print(f"  {'':42}{'measured':>10}{'at link':>10}{'pulled after':>15}")
    for label, cycle in (("without pre-pull", without), ("with pre-pull", with_prepull)):
        after = sum(cycle.pulled_after.values())
        print(f"  {label:42}{cycle.ready_seconds:8.1f} s{cycle.at_link(pushed):8.1f} s"
              f"{after / MB:12.1f} MB")  # fmt: skip
    # A node holding none of the image's layers (a new driver, or its images collected):
    # the whole image over the link, then the same start as with pre-pull (not measured here).
    whole = with_prepull.ready_seconds + pushed.pull_seconds()
    print(f"  {'without pre-pull, none of its layers held':42}{'-':>10}{whole:8.1f} s"
          f"{pushed.size / MB:12.1f} MB")  # fmt: skip
    at_link = with_prepull.at_link(pushed)
    print(f"  with / without at {rate:g} Gbit/s: {at_link / without.at_link(pushed):.2f} (one "
          f"layer to pull), {at_link / whole:.2f} (the whole image)")  # fmt: skip
    print(f"  pulled before the reboot with pre-pull: "
          f"{sum(with_prepull.pulled_before.values()) / MB:.1f} MB")  # fmt: skip
    after = sum(with_prepull.pulled_after.values())
    ready_met = at_link <= READY_GOAL_SECONDS
    bytes_met = after <= BYTES_AFTER_REBOOT_GOAL
    print(f"goal Ready after the reboot at {rate:g} Gbit/s, with pre-pull: {at_link:.1f} s "
          f"<= {READY_GOAL_SECONDS:g} s: {'meets' if ready_met else 'misses'} "
          f"(ratio {at_link / READY_GOAL_SECONDS:.2f})")  # fmt: skip
    print(f"goal bytes pulled after the reboot, with pre-pull: {after:,} <= "
          f"{BYTES_AFTER_REBOOT_GOAL}: {'meets' if bytes_met else 'misses'}")  # fmt: skip
    return ready_met and bytes_met


def main() -> int:
    parser = image_parser(__doc__)
    parser.add_argument("--runs", type=int, default=3, help="cycles of each kind (median)")
    args = image_arguments(parser)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if os.geteuid() != 0:
        parser.error("run as root: dockerd, the driver pod's mounts and unshare need it")
    os.environ["PATH"] = f"/usr/local/go/bin:{os.environ['PATH']}"  # the peers' Go, as .ci/run
    feed = feed_bytes(releases_feeds([TEST_RELEASE])["releases.json"])
    cycles: dict[bool, list[Cycle]] = {False: [], True: []}
    with ExitStack() as stack:
        _build, precompiled, _ = stack.enter_context(images(args))
        [banner] = {str(package["banner"]) for package in image_packages(precompiled)}
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gdc-cycle-")))
        apiserver = peers.build(peers.load()["kube-apiserver"]) / "kube-apiserver"
        operator_module = peers.module_dir(peers.load()["gpu-operator"])
        cluster = stack.enter_context(running_cluster(scratch / "cluster", apiserver))
        (scratch / "registry").mkdir()
        registry = stack.enter_context(local_registry(scratch / "registry"))
        cluster.namespace(OPERATOR_NAMESPACE)
        install_crds(cluster, operator_module)
        install(cluster, "fluo")
        setting = Setting(cluster, registry, AccessLog(scratch / "registry" / "registry.log"),
                          stack.enter_context(feed_server(feed)), staged_kernel(feed), banner,
                          precompiled, scratch)  # fmt: skip
        for run in range(args.runs):  # alternating, so both kinds meet the same machine
            for prepull in (False, True):
                cycles[prepull].append(run_cycle(setting, run, prepull=prepull))
        tag = precompiled_tag(BRANCH, setting.kernel, TEST_RELEASE.version)
        pushed = read_pushed(registry, "gpu-update-plain-0/driver", tag, scratch)
    with Report("update_cycle", record=args.record):
        met = print_figures(cycles, pushed)
        print(f"goals: {'met' if met else 'missed'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
