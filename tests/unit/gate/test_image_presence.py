"""Whether a registry serves a tag for an arch: the OCI distribution API and its token auth."""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from oci_registry import IMAGE as IMAGE_MANIFEST
from oci_registry import OCIRegistry
from tls_server import tls_server

from nvidia_driver.errors import DriverError
from nvidia_driver.formats.oci import (
    Credentials,
    credentials_from_docker_config,
    kubelet_credentials,
    kubelet_keyring,
)
from nvidia_driver.gate.registry import LIMITS, ImageRef, Presence, Registry
from nvidia_driver.sources.download import Backoff
from nvidia_driver.sources.http import Client

TAG = "610.57.04-flatcar4593.2.5"


@pytest.fixture
def registry() -> Iterator[OCIRegistry]:
    with OCIRegistry() as served:
        yield served


def _client() -> Registry:
    return Registry(backoff=Backoff(attempts=2, first_delay=0.1), sleep=lambda _: None)


def test_a_tag_is_missing_until_published(registry: OCIRegistry) -> None:
    image = ImageRef.parse(f"{registry.host}/o/driver:{TAG}")
    assert _client().presence(image, "amd64") is Presence.MISSING
    registry.add_image("o/driver", [TAG], ("amd64",))
    assert _client().presence(image, "amd64") is Presence.PUBLISHED
    assert _client().presence(image, "arm64") is Presence.NO_ARCH


def test_a_single_arch_image_is_judged_by_its_config(registry: OCIRegistry) -> None:
    registry.add_image("o/driver", [TAG], ("arm64",), index=False)
    image = ImageRef.parse(f"{registry.host}/o/driver:{TAG}")
    assert _client().presence(image, "arm64") is Presence.PUBLISHED
    assert _client().presence(image, "amd64") is Presence.NO_ARCH


@pytest.mark.parametrize("digest", ["sha256:../../../other/manifests/x", "sha256:" + "A" * 64, ""])
def test_a_config_digest_that_is_no_sha256_digest_is_refused_before_it_is_asked_for(
    registry: OCIRegistry, digest: str
) -> None:
    """It would go into the blob's URL: the one SHA-256 check (nvidia_driver.digests)."""
    manifest = {"schemaVersion": 2, "config": {"digest": digest}, "layers": []}
    registry.put("o/driver", [TAG], IMAGE_MANIFEST, json.dumps(manifest).encode())
    image = ImageRef.parse(f"{registry.host}/o/driver:{TAG}")
    with pytest.raises(DriverError, match=r"is not a sha256:<64 hex> digest: refused before any"):
        _client().presence(image, "amd64")
    assert [path for _, path, _ in registry.log if "/blobs/" in path] == []


def test_a_private_registry_takes_the_pull_secrets_credentials(registry: OCIRegistry) -> None:
    registry.username, registry.password = "robot", "s3cret"
    registry.add_image("o/driver", [TAG])
    image = ImageRef.parse(f"{registry.host}/o/driver:{TAG}")
    client = _client()
    credentials = [(registry.host, Credentials("robot", "s3cret"))]
    assert client.presence(image, "amd64", credentials) is Presence.PUBLISHED
    assert client.presence(image, "arm64", credentials) is Presence.NO_ARCH
    assert registry.tokens_issued == ["repository:o/driver:pull"]  # the token is kept
    wrong = [(registry.host, Credentials("robot", "wrong"))]
    with pytest.raises(DriverError, match=r"the registry refused the pull secret's credentials"):
        _client().presence(image, "amd64", wrong)
    # Every key that matches is tried, the most specific first, as the kubelet pulls.
    both = [(registry.host, Credentials("robot", "s3cret")), (f"{registry.host}/o", wrong[0][1])]
    assert _client().presence(image, "amd64", both) is Presence.PUBLISHED
    # A key for another path or port is not sent.
    others = [(f"{registry.host}/other", credentials[0][1]), ("127.0.0.1:1", credentials[0][1])]
    with pytest.raises(DriverError, match=r"gives no anonymous token"):
        _client().presence(image, "amd64", others)


@pytest.mark.parametrize(
    ("text", "host", "name", "reference", "api_host"),
    [
        (
            "ghcr.io/o/driver:610.57.04-flatcar",
            "ghcr.io",
            "o/driver",
            "610.57.04-flatcar",
            "ghcr.io",
        ),
        ("127.0.0.1:5000/gdc/driver:x", "127.0.0.1:5000", "gdc/driver", "x", "127.0.0.1:5000"),
        ("nvidia/driver:580", "docker.io", "nvidia/driver", "580", "registry-1.docker.io"),
        ("driver:580", "docker.io", "library/driver", "580", "registry-1.docker.io"),
        (
            "ghcr.io/o/driver@sha256:" + "ab" * 32,
            "ghcr.io",
            "o/driver",
            "sha256:" + "ab" * 32,
            "ghcr.io",
        ),
    ],
)
def test_image_references_read_as_the_distribution_grammar_does(
    text: str, host: str, name: str, reference: str, api_host: str
) -> None:
    image = ImageRef.parse(text)
    assert (image.host, image.name, image.reference, image.api_host) == (
        host,
        name,
        reference,
        api_host,
    )
    assert ImageRef.parse(str(image)) == image


def test_docker_config_json_in_every_form_kubectl_and_docker_write() -> None:
    auth = base64.b64encode(b"u:p").decode()
    config = {
        "auths": {
            "ghcr.io": {"auth": auth},
            "https://quay.io/v1/": {"username": "q", "password": "w"},
            "https://index.docker.io/v1/": {"auth": auth},
            "broken.example": {"auth": "!!"},
        }
    }
    assert credentials_from_docker_config(config) == {
        "ghcr.io": Credentials("u", "p"),
        "quay.io": Credentials("q", "w"),
        "docker.io": Credentials("u", "p"),
    }
    assert credentials_from_docker_config({"ghcr.io": {"auth": auth}}) == {  # .dockercfg
        "ghcr.io": Credentials("u", "p")
    }
    # A host's own key wins over its URL forms, whichever comes first.
    url_form = {"https://ghcr.io/v1/": {"username": "url", "password": "form"}}
    for auths in ({**url_form, "ghcr.io": {"auth": auth}}, {"ghcr.io": {"auth": auth}, **url_form}):
        assert credentials_from_docker_config({"auths": auths}) == {
            "ghcr.io": Credentials("u", "p")
        }


def _keyring(*keys: str) -> list[tuple[str, Credentials]]:
    """A pull secret whose keys are these, each with credentials named after its key."""
    auths = {key: {"username": key, "password": "p"} for key in keys}
    return kubelet_keyring({"auths": auths}, "pull secret ns/s")


@pytest.mark.parametrize(
    ("keys", "repository", "tried"),
    [
        # A key scoped to a path serves only that path, and before its host's key.
        (
            ("ghcr.io", "https://ghcr.io/team-a"),
            "ghcr.io/team-a/driver",
            ["https://ghcr.io/team-a", "ghcr.io"],
        ),
        (("ghcr.io/team-a", "ghcr.io"), "ghcr.io/team-b/driver", ["ghcr.io"]),
        (("ghcr.io/team-a",), "ghcr.io/team-b/driver", []),
        # A host glob matches one dot-separated part per *.
        (("*.example.com",), "reg.example.com/o/driver", ["*.example.com"]),
        (("*.example.com",), "a.reg.example.com/o/driver", []),
        (("*.example.com",), "example.com/o/driver", []),
        (("*.*.example.com",), "a.reg.example.com/o/driver", ["*.*.example.com"]),
        # The port must match; a scheme and a /v1/ or /v2/ path are no part of the key.
        (("reg.example.com:5000",), "reg.example.com/o/driver", []),
        (("reg.example.com",), "reg.example.com:5000/o/driver", []),
        (
            ("http://reg.example.com:5000/v2/",),
            "reg.example.com:5000/o/driver",
            ["http://reg.example.com:5000/v2/"],
        ),
        # Docker Hub: its own key, or index.docker.io's when no key matches.
        (
            ("https://index.docker.io/v1/",),
            "docker.io/library/driver",
            ["https://index.docker.io/v1/"],
        ),
        (("https://index.docker.io/v1/", "docker.io"), "docker.io/nvidia/driver", ["docker.io"]),
        (("https://index.docker.io/v1/",), "ghcr.io/o/driver", []),
    ],
)
def test_pull_secret_keys_are_matched_to_an_image_as_the_kubelet_matches_them(
    keys: tuple[str, ...], repository: str, tried: list[str]
) -> None:
    """kubernetes pkg/credentialprovider/keyring.go (BasicDockerKeyring.Add, Lookup,
    URLsMatch): the kubelet pulls the driver image after the reboot with the credentials it
    picks, so the gate asks the registry with the same ones, in the same order."""
    assert kubelet_credentials(_keyring(*keys), repository) == [
        Credentials(key, "p") for key in tried
    ]


def _trusting(certificate: Path) -> Registry:
    """A client that trusts the storage host's throw-away certificate."""
    context = ssl.create_default_context(cafile=str(certificate))
    client = Client(LIMITS, context)
    return Registry(client=client, backoff=Backoff(attempts=1), sleep=lambda _: None)


def test_a_blob_redirected_to_an_https_storage_host_is_followed_without_credentials(
    registry: OCIRegistry, tmp_path: Path
) -> None:
    """ghcr.io and Docker Hub answer a blob GET with 307 to their storage: a single-arch
    image's config is read there, with no token sent, and checked against its digest."""
    registry.username, registry.password = "robot", "s3cret"
    registry.add_image("o/driver", [TAG], ("amd64",), index=False)
    [config] = [blob for blob in registry.blobs.values() if b'"architecture"' in blob]
    image = ImageRef.parse(f"{registry.host}/o/driver:{TAG}")
    with tls_server(tmp_path, config) as storage:
        registry.blob_storage = storage.url
        client = _trusting(storage.certificate)
        credentials = [(registry.host, Credentials("robot", "s3cret"))]
        assert client.presence(image, "amd64", credentials) is Presence.PUBLISHED
        assert client.presence(image, "arm64", credentials) is Presence.NO_ARCH
        assert storage.headers
        assert not any("Authorization" in headers for headers in storage.headers)


def test_a_redirected_blob_that_is_not_its_digest_is_refused(
    registry: OCIRegistry, tmp_path: Path
) -> None:
    registry.add_image("o/driver", [TAG], ("amd64",), index=False)
    image = ImageRef.parse(f"{registry.host}/o/driver:{TAG}")
    with tls_server(tmp_path, b'{"architecture": "amd64", "os": "linux"}') as storage:
        registry.blob_storage = storage.url
        with pytest.raises(DriverError, match="does not match its digest"):
            _trusting(storage.certificate).presence(image, "amd64")


def test_a_blob_redirect_to_plain_http_is_refused(registry: OCIRegistry) -> None:
    registry.add_image("o/driver", [TAG], ("amd64",), index=False)
    registry.blob_storage = "http://storage.example/blob"
    image = ImageRef.parse(f"{registry.host}/o/driver:{TAG}")
    with pytest.raises(DriverError, match="not https"):
        _client().presence(image, "amd64")
