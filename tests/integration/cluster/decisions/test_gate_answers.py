"""What the gate does with what registries and Flatcar's feed answer, its cluster in the real
kube-apiserver: one registry client per checker, and answers it cannot read, which hold.

The registry and the feed are this suite's own (oci_registry.py, a file): they serve what no real
registry is made to serve on demand (a manifest of the wrong shape, a body 1,000 deep).
"""

from __future__ import annotations

import pytest
from gate_cluster import STAGED, Clock, GateCluster
from oci_registry import IMAGE, INDEX

from nvidia_driver.gate.registry import PUBLISHED_FOR

pytestmark = pytest.mark.cluster

DEEP = b'{"a":' * 1000 + b"1" + b"}" * 1000
HUGE_INTEGER = b'{"n": ' + b"9" * 5000 + b"}"
TAG = f"610.57.04-flatcar{STAGED}"


def test_one_checker_keeps_its_registry_client_and_a_published_verdict(
    gpu_cluster: GateCluster,
) -> None:
    """A gate process judges with one client: a missing image costs one HEAD a look, and a
    published one is not asked about again for PUBLISHED_FOR."""
    gpu_cluster.add_node("gpu-1")
    gpu_cluster.cluster_policy("610.57.04")
    clock = Clock()
    checker = gpu_cluster.checker(gpu_cluster.api_client())
    checker.registry.clock = clock
    manifest = f"/v2/o/driver/manifests/{TAG}"
    assert not checker.verdict(gpu_cluster.node("gpu-1"), STAGED).allowed
    assert gpu_cluster.registry.asked() == [("HEAD", manifest)]
    gpu_cluster.publish(TAG)
    clock.now += 60
    assert checker.verdict(gpu_cluster.node("gpu-1"), STAGED).allowed
    [(head, _), (get, by_digest)] = gpu_cluster.registry.asked()
    assert (head, get) == ("HEAD", "GET")
    assert by_digest.startswith("/v2/o/driver/manifests/sha256:")  # the index HEAD named
    clock.now += PUBLISHED_FOR - 1
    assert checker.verdict(gpu_cluster.node("gpu-1"), STAGED).allowed
    assert gpu_cluster.registry.asked() == []
    clock.now += 1
    assert checker.verdict(gpu_cluster.node("gpu-1"), STAGED).allowed
    assert gpu_cluster.registry.asked() == [("HEAD", manifest)]  # the same digest: nothing to read


@pytest.mark.parametrize(
    ("feed", "reason"),
    [
        (b"\xff\xfe{}", "is not UTF-8 text (byte 0 is 0xff)"),
        (DEEP, "nested deeper"),
        (HUGE_INTEGER, "not JSON"),
    ],
    ids=["not-utf8", "deep", "huge-integer"],
)
def test_a_feed_the_gate_cannot_read_holds(
    gpu_cluster: GateCluster, feed: bytes, reason: str
) -> None:
    gpu_cluster.published()
    gpu_cluster.feed_file.write_bytes(feed)
    verdict = gpu_cluster.judge()
    assert not verdict.allowed
    assert "Flatcar's releases feed" in verdict.line
    assert reason in verdict.line


@pytest.mark.parametrize(
    ("media_type", "manifest", "reason"),
    [
        (INDEX, DEEP, "nested deeper"),
        (INDEX, b'{"manifests": 5}', "manifests is not a list of JSON objects"),
        (IMAGE, b'{"config": []}', "config is not a JSON object"),
        (INDEX, b'{"manifests": [{"platform": []}]}', "no linux/amd64 image"),
    ],
    ids=["deep", "manifests-5", "config-list", "platform-list"],
)
def test_a_manifest_the_gate_cannot_read_holds(
    gpu_cluster: GateCluster, media_type: str, manifest: bytes, reason: str
) -> None:
    gpu_cluster.published()
    gpu_cluster.registry.put("o/driver", [TAG], media_type, manifest)
    verdict = gpu_cluster.judge()
    assert not verdict.allowed
    assert reason in verdict.line
