"""What the gate asks registries, look after look: one client and token per process, HEADs,
verdicts kept for a stated time, and a registry that answers 429 or 5xx left alone a while."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import STAGED
from gate_cluster import Clock
from oci_registry import OCIRegistry

from nvidia_driver.errors import DriverError
from nvidia_driver.formats.oci import Credentials
from nvidia_driver.gate.registry import (
    QUIET_FIRST,
    TOKEN_LIFETIME,
    ImageRef,
    Presence,
    Registry,
)
from nvidia_driver.sources.download import Backoff

TAG = f"610.57.04-flatcar{STAGED}"


@pytest.fixture
def registry() -> Iterator[OCIRegistry]:
    with OCIRegistry() as served:
        yield served


def test_a_token_is_kept_for_its_lifetime_and_renewed_without_a_401(
    registry: OCIRegistry,
) -> None:
    registry.username, registry.password = "robot", "s3cret"
    clock = Clock()
    client = Registry(backoff=Backoff(attempts=1), sleep=lambda _: None, clock=clock)
    credentials = [(registry.host, Credentials("robot", "s3cret"))]
    image = ImageRef.parse(f"{registry.host}/o/driver:{TAG}")
    manifest = ("HEAD", f"/v2/o/driver/manifests/{TAG}")
    assert client.presence(image, "amd64", credentials) is Presence.MISSING
    assert registry.asked() == [manifest, ("GET", "/token"), manifest]
    clock.now += 30
    assert client.presence(image, "amd64", credentials) is Presence.MISSING
    assert registry.asked() == [manifest]
    clock.now += TOKEN_LIFETIME  # past the spec's default lifetime: a new token, asked first
    assert client.presence(image, "amd64", credentials) is Presence.MISSING
    assert registry.asked() == [("GET", "/token"), manifest]


def test_a_single_arch_images_config_is_read_once_per_digest(registry: OCIRegistry) -> None:
    registry.add_image("o/driver", [TAG], ("amd64",), index=False)
    clock = Clock()
    client = Registry(backoff=Backoff(attempts=1), sleep=lambda _: None, clock=clock)
    image = ImageRef.parse(f"{registry.host}/o/driver:{TAG}")
    assert client.presence(image, "amd64") is Presence.PUBLISHED
    assert [method for method, _ in registry.asked()] == ["HEAD", "GET", "GET"]  # config blob
    assert client.presence(image, "arm64") is Presence.NO_ARCH
    assert [method for method, _ in registry.asked()] == ["HEAD"]


def test_a_registry_whose_head_names_no_digest_is_asked_with_get(registry: OCIRegistry) -> None:
    registry.add_image("o/driver", [TAG])
    registry.head_status = 405
    client = Registry(backoff=Backoff(attempts=1), sleep=lambda _: None, clock=Clock())
    image = ImageRef.parse(f"{registry.host}/o/driver:{TAG}")
    assert client.presence(image, "arm64") is Presence.NO_ARCH
    assert registry.asked() == [
        ("HEAD", f"/v2/o/driver/manifests/{TAG}"),
        ("GET", f"/v2/o/driver/manifests/{TAG}"),
    ]
    assert client.presence(image, "arm64") is Presence.NO_ARCH
    assert registry.asked() == [("GET", f"/v2/o/driver/manifests/{TAG}")]  # HEAD not tried again


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
    assert len(registry.asked()) == 3
    clock.now += QUIET_FIRST * 0.75 - 1
    with pytest.raises(DriverError, match=r"answered 429 .* asks it again in 1 s"):
        client.presence(image, "amd64")
    assert registry.asked() == []  # not asked at all while it is left alone
    clock.now += 1
    assert client.presence(image, "amd64") is Presence.MISSING
