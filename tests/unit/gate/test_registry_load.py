"""What the gate asks registries, look after look: one client and token per process, HEADs,
verdicts kept for a stated time, and a registry that answers 429 or 5xx left alone a while."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import STAGED, Cluster
from oci_registry import OCIRegistry

from nvidia_driver.errors import DriverError
from nvidia_driver.formats.oci import Credentials
from nvidia_driver.gate.registry import (
    PUBLISHED_FOR,
    QUIET_FIRST,
    TOKEN_LIFETIME,
    ImageRef,
    Presence,
    Registry,
)
from nvidia_driver.sources.download import Backoff

TAG = f"610.57.04-flatcar{STAGED}"


class Clock:
    """The registry client's time, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def registry() -> Iterator[OCIRegistry]:
    with OCIRegistry() as served:
        yield served


def _asked(registry: OCIRegistry) -> list[tuple[str, str]]:
    """The requests since the last call: method and path."""
    asked = [(method, path) for method, path, _ in registry.log]
    registry.log.clear()
    return asked


def test_one_checker_keeps_its_registry_client_and_a_published_verdict(cluster: Cluster) -> None:
    """A gate process judges with one client: a missing image costs one HEAD a look, and a
    published one is not asked about again for PUBLISHED_FOR."""
    cluster.add_node("gpu-1")
    cluster.cluster_policy("610.57.04")
    clock = Clock()
    checker = cluster.checker(cluster.api_client())
    checker.registry.clock = clock
    manifest = f"/v2/o/driver/manifests/{TAG}"
    assert not checker.verdict(cluster.node("gpu-1"), STAGED).allowed
    assert _asked(cluster.registry) == [("HEAD", manifest)]
    cluster.publish(TAG)
    clock.now += 60
    assert checker.verdict(cluster.node("gpu-1"), STAGED).allowed
    [(head, _), (get, by_digest)] = _asked(cluster.registry)
    assert (head, get) == ("HEAD", "GET")
    assert by_digest.startswith("/v2/o/driver/manifests/sha256:")  # the index HEAD named
    clock.now += PUBLISHED_FOR - 1
    assert checker.verdict(cluster.node("gpu-1"), STAGED).allowed
    assert _asked(cluster.registry) == []
    clock.now += 1
    assert checker.verdict(cluster.node("gpu-1"), STAGED).allowed
    assert _asked(cluster.registry) == [("HEAD", manifest)]  # the same digest: nothing to read


def test_a_token_is_kept_for_its_lifetime_and_renewed_without_a_401(
    registry: OCIRegistry,
) -> None:
    registry.username, registry.password = "robot", "s3cret"
    clock = Clock()
    client = Registry(backoff=Backoff(attempts=1), sleep=lambda _: None, clock=clock)
    credentials = {registry.host: Credentials("robot", "s3cret")}
    image = ImageRef.parse(f"{registry.host}/o/driver:{TAG}")
    manifest = ("HEAD", f"/v2/o/driver/manifests/{TAG}")
    assert client.presence(image, "amd64", credentials) is Presence.MISSING
    assert _asked(registry) == [manifest, ("GET", "/token"), manifest]
    clock.now += 30
    assert client.presence(image, "amd64", credentials) is Presence.MISSING
    assert _asked(registry) == [manifest]
    clock.now += TOKEN_LIFETIME  # past the spec's default lifetime: a new token, asked first
    assert client.presence(image, "amd64", credentials) is Presence.MISSING
    assert _asked(registry) == [("GET", "/token"), manifest]


def test_a_single_arch_images_config_is_read_once_per_digest(registry: OCIRegistry) -> None:
    registry.add_image("o/driver", [TAG], ("amd64",), index=False)
    clock = Clock()
    client = Registry(backoff=Backoff(attempts=1), sleep=lambda _: None, clock=clock)
    image = ImageRef.parse(f"{registry.host}/o/driver:{TAG}")
    assert client.presence(image, "amd64") is Presence.PUBLISHED
    assert [method for method, _ in _asked(registry)] == ["HEAD", "GET", "GET"]  # config blob
    assert client.presence(image, "arm64") is Presence.NO_ARCH
    assert [method for method, _ in _asked(registry)] == ["HEAD"]


def test_a_registry_whose_head_names_no_digest_is_asked_with_get(registry: OCIRegistry) -> None:
    registry.add_image("o/driver", [TAG])
    registry.head_status = 405
    client = Registry(backoff=Backoff(attempts=1), sleep=lambda _: None, clock=Clock())
    image = ImageRef.parse(f"{registry.host}/o/driver:{TAG}")
    assert client.presence(image, "arm64") is Presence.NO_ARCH
    assert _asked(registry) == [
        ("HEAD", f"/v2/o/driver/manifests/{TAG}"),
        ("GET", f"/v2/o/driver/manifests/{TAG}"),
    ]
    assert client.presence(image, "arm64") is Presence.NO_ARCH
    assert _asked(registry) == [("GET", f"/v2/o/driver/manifests/{TAG}")]  # HEAD not tried again


def test_429s_are_retried_with_jitter_then_the_registry_is_left_alone_a_while(
    registry: OCIRegistry,
) -> None:
    registry.burst = [(429, "")] * 3
    sleeps: list[float] = []
    clock = Clock()
    client = Registry(
        backoff=Backoff(attempts=3, first_delay=2.0),
        sleep=sleeps.append,
        clock=clock,
        jitter=lambda delay: delay * 0.75,
    )
    image = ImageRef.parse(f"{registry.host}/o/driver:{TAG}")
    with pytest.raises(DriverError, match="the registry answered 429"):
        client.presence(image, "amd64")
    assert sleeps == [1.5, 3.0]  # the backoff's 2 and 4 s, jittered
    assert len(_asked(registry)) == 3
    clock.now += QUIET_FIRST * 0.75 - 1
    with pytest.raises(DriverError, match=r"answered 429 .* asks it again in 1 s"):
        client.presence(image, "amd64")
    assert _asked(registry) == []  # not asked at all while it is left alone
    clock.now += 1
    assert client.presence(image, "amd64") is Presence.MISSING
