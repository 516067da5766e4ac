"""The OCI registry client against a loopback registry: tags, token auth, errors, copies."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from oci_registry import IMAGE, INDEX, OCIRegistry, digest_of

from gdc.registry import Registry, Repository, credentials_for
from nvidia_driver.errors import DriverError
from nvidia_driver.formats.oci import (
    ACCEPT,
    DOCKER_HUB_API,
    MAX_MANIFEST_BYTES,
    Credentials,
    Manifest,
    check_realm,
    plain_http,
    token_hosts,
    token_url,
)
from nvidia_driver.safetext import unsafe
from nvidia_driver.sources.http import Answer, Limits

NAME = "gdc/driver"
CONFIG_DIGEST = "sha256:" + "2" * 64
IMAGE_MANIFEST = Manifest(
    "application/vnd.oci.image.manifest.v1+json",
    json.dumps({"config": {"digest": CONFIG_DIGEST}}).encode(),
    "sha256:" + "3" * 64,
)
PASSWORD = "s3cret"  # noqa: S105 - the loopback registry's


@pytest.fixture
def registry() -> Iterator[OCIRegistry]:
    with OCIRegistry() as server:
        yield server


@pytest.fixture
def ghcr_like() -> Iterator[OCIRegistry]:
    with OCIRegistry(username="me", password=PASSWORD) as server:
        yield server


def test_a_tag_exists_with_its_digest_or_is_missing(registry: OCIRegistry) -> None:
    digest = registry.add_image(NAME, ["580.178.04-flatcar"])
    client = Registry(registry.host)
    assert client.base_url == f"http://{registry.host}"
    assert client.digest(NAME, "580.178.04-flatcar") == digest
    assert client.digest(NAME, "580.178.04-flatcar-flatcar4593.2.5") is None
    assert client.digest("other/driver", "x") is None
    method, path, _ = registry.log[0]
    assert (method, path) == ("GET", f"/v2/{NAME}/manifests/580.178.04-flatcar")


def test_manifest_requests_accept_oci_and_docker_types() -> None:
    for media_type in (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ):
        assert media_type in ACCEPT


def test_a_401_is_answered_with_a_token_for_the_challenge_scope(ghcr_like: OCIRegistry) -> None:
    digest = ghcr_like.add_image(NAME, ["t"])
    client = Registry(ghcr_like.host, credentials=Credentials("me", PASSWORD))
    assert client.digest(NAME, "t") == digest
    assert client.digest(NAME, "u") is None  # the token is reused
    assert ghcr_like.tokens_issued == [f"repository:{NAME}:pull"]
    assert [entry[2] for entry in ghcr_like.log] == [
        "",
        "Basic " + base64.b64encode(b"me:s3cret").decode(),
        f"Bearer token:repository:{NAME}:pull",
        f"Bearer token:repository:{NAME}:pull",
    ]


def test_a_tag_is_copied_by_a_manifest_put_with_a_push_token(ghcr_like: OCIRegistry) -> None:
    digest = ghcr_like.add_image(NAME, ["580.178.04-flatcar"], ("amd64", "arm64"))
    client = Registry(ghcr_like.host, credentials=Credentials("me", PASSWORD))
    manifest = client.manifest(NAME, "580.178.04-flatcar")
    assert manifest.is_index
    assert manifest.media_type == INDEX
    assert client.put_manifest(NAME, "580.178.04-flatcar-flatcar4790.0.0", manifest) == digest
    assert ghcr_like.tags(NAME)["580.178.04-flatcar-flatcar4790.0.0"] == digest
    assert ghcr_like.tokens_issued[-1] == f"repository:{NAME}:pull,push"


def test_platforms_of_an_index_and_of_a_single_image(registry: OCIRegistry) -> None:
    registry.add_image(NAME, ["multi"], ("amd64", "arm64"))
    registry.add_image(NAME, ["single"], ("arm64",), index=False)
    client = Registry(registry.host)
    assert client.platforms(NAME, "multi") == {"linux/amd64", "linux/arm64"}
    assert client.platforms(NAME, "single") == {"linux/arm64"}


def test_wrong_credentials_are_one_line_saying_what_to_set(ghcr_like: OCIRegistry) -> None:
    client = Registry(ghcr_like.host, credentials=Credentials("me", "wrong"))
    with pytest.raises(DriverError) as error:
        client.digest(NAME, "t")
    message = str(error.value)
    assert "\n" not in message
    assert f"the registry {ghcr_like.host} refused access" in message
    assert "answered 401 Unauthorized" in message
    assert "REGISTRY_USERNAME" in message
    assert "GITHUB_TOKEN" in message


def test_a_server_error_is_one_line_with_the_registry_s_own_words(
    registry: OCIRegistry,
) -> None:
    registry.status = 503
    waits: list[float] = []  # the retries' backoff, recorded instead of slept (1 + 2 + 4 + 8 s)
    with pytest.raises(DriverError, match=r"answered GET gdc/driver:t with 503") as error:
        Registry(registry.host, sleep=waits.append).digest(NAME, "t")
    registry.status = 500
    with pytest.raises(DriverError, match=r"\(UNAVAILABLE: down\)"):
        Registry(registry.host, sleep=waits.append).manifest(NAME, "t")
    assert waits == [1, 2, 4, 8] * 2
    assert "\n" not in str(error.value)


def test_an_unreachable_registry_says_so_in_one_line() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(DriverError, match=r"cannot reach the registry 127\.0\.0\.1:\d+") as err:
        Registry(f"127.0.0.1:{port}").digest(NAME, "t")
    assert "\n" not in str(err.value)
    assert "check --registry" in str(err.value)


@pytest.mark.parametrize(
    ("host", "plain"),
    [("127.0.0.1:5000", True), ("localhost:5000", True), ("localhost", True),
     ("[::1]:5000", True), ("ghcr.io", False), ("registry.example:443", False),
     ("127.0.0.1.nip.io:5000", False), ("127.0.0.1@ghcr.io", False)],
)  # fmt: skip
def test_plain_http_only_on_the_loopback(host: str, plain: bool) -> None:
    assert plain_http(host) is plain


def test_a_repository_needs_a_registry_host() -> None:
    assert Repository.parse("ghcr.io/me/driver") == Repository("ghcr.io", "me/driver")
    assert str(Repository.parse("127.0.0.1:5000/gdc/driver")) == "127.0.0.1:5000/gdc/driver"
    with pytest.raises(DriverError, match=r"pass --registry with one, e\.g\. ghcr\.io/<owner>"):
        Repository.parse("driver")
    with pytest.raises(DriverError, match="names no registry host"):
        Repository.parse("me/driver")


def test_credentials_come_from_the_environment_then_docker_config(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    auth = base64.b64encode(b"docker-user:docker-pass").decode()
    config.write_text(json.dumps({"auths": {"ghcr.io": {"auth": auth}}}))
    env = {"REGISTRY_USERNAME": "u", "REGISTRY_PASSWORD": "p", "GITHUB_TOKEN": "gh"}
    assert credentials_for("ghcr.io", env, config) == Credentials("u", "p")
    assert credentials_for("ghcr.io", {"GITHUB_TOKEN": "gh"}, config) == Credentials(
        "docker-user", "docker-pass"
    )
    github = {"GITHUB_TOKEN": "gh", "GITHUB_ACTOR": "octocat"}
    assert credentials_for("ghcr.io", github, tmp_path / "none.json") == Credentials(
        "octocat", "gh"
    )
    assert credentials_for("quay.io", github, tmp_path / "none.json") is None
    assert credentials_for("ghcr.io", {"DOCKER_CONFIG": str(tmp_path)}) == Credentials(
        "docker-user", "docker-pass"
    )


def test_the_docker_config_is_read_as_the_reboot_gate_reads_a_pull_secret(tmp_path: Path) -> None:
    """One reader (nvidia_driver.gate.registry): URL keys, username and password entries, and a
    host's own key before its URL forms."""
    config = tmp_path / "config.json"
    auth = base64.b64encode(b"docker-user:docker-pass").decode()
    config.write_text(json.dumps({"auths": {
        "ghcr.io": {"auth": auth},
        "https://ghcr.io": {"auth": base64.b64encode(b"other:other").decode()},
        "https://quay.io/v1/": {"username": "q", "password": "w"},
        "broken.example": {"auth": "!!"},
    }}))  # fmt: skip
    assert credentials_for("ghcr.io", {}, config) == Credentials("docker-user", "docker-pass")
    assert credentials_for("quay.io", {}, config) == Credentials("q", "w")
    assert credentials_for("broken.example", {}, config) is None
    config.write_text("[]")
    assert credentials_for("ghcr.io", {}, config) is None


class TokenService(OCIRegistry):
    """A ghcr.io-like registry whose token service answers with status (and Retry-After: 1)."""

    token_status = 429

    def _token(self, handler: BaseHTTPRequestHandler, query: dict[str, list[str]]) -> None:  # noqa: ARG002
        handler.send_response(self.token_status)
        for key, value in (("Retry-After", "1"), ("Content-Length", "0")):
            handler.send_header(key, value)
        handler.end_headers()


def test_a_rate_limited_token_service_is_a_rate_limit_not_a_credentials_problem() -> None:
    with TokenService(username="me", password=PASSWORD) as server:
        waits: list[float] = []
        client = Registry(server.host, credentials=Credentials("me", PASSWORD),
                          sleep=waits.append, retry_budget=2)  # fmt: skip
        with pytest.raises(DriverError) as error:
            client.digest(NAME, "t")
        assert waits == [1.0, 1.0]  # within the budget, then the answer stands
        assert str(error.value) == (
            f"the registry {server.host}'s token service http://{server.host}/token answered "
            "429 Too Many Requests after 2 s of retries: rate-limited by the registry (HTTP "
            "429), retry later"
        )
        server.token_status = 503
        with pytest.raises(DriverError, match="the registry is in trouble, retry later"):
            Registry(server.host, credentials=Credentials("me", PASSWORD),
                     sleep=waits.append).digest(NAME, "t")  # fmt: skip


# --- every error is one line -------------------------------------------------------------------


class Broken(OCIRegistry):
    """Answers /v2 requests with a fixed status, body and headers."""

    answer_with: tuple[int, bytes, dict[str, str]] = (500, b"", {})
    reason: str | None = None  # the status line's; None: the status's own

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        if not handler.path.startswith("/v2/"):
            super().answer(handler)
            return
        handler.rfile.read(int(handler.headers.get("Content-Length", "0")))
        status, body, headers = self.answer_with
        handler.send_response(status, self.reason)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            handler.send_header(key, value)
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(body)


TWO_LINES = b'{"errors":[{"code":"UNAVAILABLE","message":"down\\nfor maintenance\\n\\tback soon"}]}'
# What splitting by blanks leaves: a terminal escape, a bidirectional override, a NUL.
CONTROLS = (b'{"errors":[{"code":"UNAVAILABLE","message":"down\\u001b[2J\\u202eERROR: forged'
            b'\\u0000"}]}')  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "call"),
    [
        ((500, TWO_LINES, {}), "manifest"),
        ((500, CONTROLS, {}), "manifest"),
        ((503, TWO_LINES, {"Retry-After": "3600"}), "manifest"),
        ((429, b"", {"Retry-After": "1"}), "put"),
        ((401, b"", {"WWW-Authenticate": "Negotiate"}), "manifest"),
        ((401, b"", {"WWW-Authenticate": 'Bearer realm="http://127.0.0.1:9/token"'}), "manifest"),
        ((404, b"", {}), "config"),
        ((200, b"not json", {"Content-Type": "application/octet-stream"}), "config"),
    ],
)
def test_every_registry_error_is_one_line(answer: tuple[int, bytes, dict[str, str]],
                                          call: str) -> None:  # fmt: skip
    with Broken() as server:
        server.answer_with = answer
        client = Registry(server.host, sleep=lambda _seconds: None, retry_budget=1)
        calls = {
            "manifest": lambda: client.manifest(NAME, "t"),
            "put": lambda: client.put_manifest(NAME, "t", IMAGE_MANIFEST),
            "config": lambda: client.config(NAME, IMAGE_MANIFEST),
        }
        with pytest.raises(DriverError) as error:
            calls[call]()
    message = str(error.value)
    assert "\n" not in message, message
    assert message.startswith(f"the registry {server.host}") or "cannot reach" in message
    assert unsafe(message) is None, message


def test_a_registry_s_error_and_status_line_reach_the_message_escaped() -> None:
    with Broken() as server:
        server.answer_with = (500, CONTROLS, {})
        server.reason = "Oops\x85ERROR: forged\x1b[2J"  # \x85 is a blank to str.split()
        with pytest.raises(DriverError) as error:
            Registry(server.host, sleep=lambda _seconds: None).manifest(NAME, "t")
    assert str(error.value) == (
        f"the registry {server.host} answered GET {NAME}:t with 500 Oops ERROR: forged"
        "\\x1b[2J (UNAVAILABLE: down\\x1b[2J\\u202eERROR: forged\\x00): check the registry and "
        "the credentials' permissions"
    )
    assert str(error.value).splitlines() == [str(error.value)]


# --- blobs -------------------------------------------------------------------------------------


def test_a_digest_other_than_sha256_is_refused(registry: OCIRegistry) -> None:
    with pytest.raises(DriverError, match="is not a sha256:<64 hex> digest"):
        Registry(registry.host).blob_exists(NAME, "sha512:" + "a" * 128)
    assert registry.log == []


def test_an_upload_is_checked_by_the_registry(registry: OCIRegistry, tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(b"bytes")
    client = Registry(registry.host)
    digest = "sha256:" + hashlib.sha256(b"bytes").hexdigest()
    client.upload_blob(NAME, blob, digest)
    assert registry.blobs[digest] == b"bytes"
    assert client.blob_exists(NAME, digest)
    with pytest.raises(DriverError, match="DIGEST_INVALID"):
        client.upload_blob(NAME, blob, "sha256:" + "1" * 64)


class ElsewhereUploads(OCIRegistry):
    """Hands out upload locations on another server (as a registry fronted by storage may)."""

    elsewhere = ""

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        if handler.command == "POST" and self._authorized(handler, NAME, "POST"):
            handler.send_response(202)
            handler.send_header("Location", f"http://{self.elsewhere}/v2/{NAME}/blobs/uploads/1")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        super().answer(handler)


def test_an_upload_location_on_another_host_is_sent_no_credentials(tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(b"bytes")
    digest = "sha256:" + hashlib.sha256(b"bytes").hexdigest()
    with OCIRegistry() as storage, ElsewhereUploads(username="me", password=PASSWORD) as server:
        server.elsewhere = storage.host
        client = Registry(server.host, credentials=Credentials("me", PASSWORD))
        client.upload_blob(NAME, blob, digest)
        assert storage.blobs[digest] == b"bytes"
        assert [(method, auth) for method, _, auth in storage.log] == [("PUT", "")]


def test_an_upload_location_that_is_no_url_is_refused_in_one_line(tmp_path: Path) -> None:
    """urllib.parse raises ValueError for a bracketed host that is no IPv6 address: one
    DriverError (formats/oci.joined, as for a redirect), not a traceback out of publish."""
    blob = tmp_path / "blob"
    blob.write_bytes(b"bytes")
    with ElsewhereUploads(username="me", password=PASSWORD) as server:
        server.elsewhere = "[storage.example"
        client = Registry(server.host, credentials=Credentials("me", PASSWORD))
        with pytest.raises(DriverError, match=rf"^the registry {server.host} started an upload "
                           rf"to {NAME} and sent it to http://\[storage\.example/v2/.*, which is "
                           "not a URL; check the registry$"):  # fmt: skip
            client.upload_blob(NAME, blob, "sha256:" + "1" * 64)
        assert "PUT" not in [method for method, _, _ in server.log]  # nothing is sent


# --- every answer is read bounded, shape-checked and checked against its digest ----------------


def _image(config: object = None, layers: object = ()) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": IMAGE,
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                  "digest": CONFIG_DIGEST, "size": 2}
                       if config is None else config,
                       "layers": list(layers)}).encode()  # fmt: skip


MAINTENANCE = b"<html><body>Down for maintenance</body></html>"


@pytest.mark.parametrize(
    ("body", "headers", "why"),
    [
        (MAINTENANCE, {}, "not JSON"),
        (b'"a manifest"', {"Content-Type": IMAGE}, "not a JSON object"),
        (_image(config="sha256:" + "2" * 64), {"Content-Type": IMAGE}, "config is not"),
        (_image(layers=["a layer"]), {"Content-Type": IMAGE}, "layers is not"),
        (json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": "x"}).encode(),
         {"Content-Type": INDEX}, "manifests is not"),
        (json.dumps({"schemaVersion": 2, "config": {}}).encode(),
         {"Content-Type": "application/vnd.evil+json"}, "media type"),
        (_image(), {"Content-Type": INDEX}, "media type"),
    ],
)  # fmt: skip
def test_a_manifest_of_the_wrong_shape_or_type_is_one_line(
    registry: OCIRegistry, body: bytes, headers: dict[str, str], why: str
) -> None:
    registry.spoiled[f"/v2/{NAME}/manifests/t"] = (200, body, headers)
    with pytest.raises(DriverError, match=why) as error:
        Registry(registry.host).manifest(NAME, "t")
    assert str(error.value).splitlines() == [str(error.value)]
    assert str(error.value).startswith(f"the registry {registry.host} ")


def test_a_config_that_is_not_a_json_object_is_one_line(registry: OCIRegistry) -> None:
    config = b'"linux/amd64"'
    registry.blobs[digest_of(config)] = config
    manifest = Manifest(IMAGE, _image({"digest": digest_of(config), "size": len(config)}), "")
    with pytest.raises(DriverError, match="is not a JSON object"):
        Registry(registry.host).config(NAME, manifest)
    registry.add_image(NAME, ["t"], index=False)
    registry.spoiled[f"/v2/{NAME}/manifests/t"] = (200, manifest.body, {"Content-Type": IMAGE})
    with pytest.raises(DriverError, match="is not a JSON object"):
        Registry(registry.host).platforms(NAME, "t")


def test_a_config_blob_is_checked_against_its_digest(registry: OCIRegistry) -> None:
    config = b'{"os": "linux", "architecture": "amd64"}'
    other = b'{"os": "linux", "architecture": "arm64"}'
    registry.blobs[digest_of(config)] = other  # the registry's copy is not what it names
    manifest = Manifest(IMAGE, _image({"digest": digest_of(config), "size": len(config)}), "")
    with pytest.raises(DriverError, match="refused"):
        Registry(registry.host).config(NAME, manifest)


def test_a_manifest_s_digest_is_its_body_s_not_a_header_s(registry: OCIRegistry) -> None:
    amd64 = registry.add_image(NAME, ["amd64"], index=False)
    registry.add_image(NAME, ["arm64"], ("arm64",), index=False)
    body = registry.manifests[NAME]["arm64"].body
    headers = {"Content-Type": IMAGE, "Docker-Content-Digest": amd64}
    registry.spoiled[f"/v2/{NAME}/manifests/arm64"] = (200, body, headers)
    client = Registry(registry.host)
    with pytest.raises(DriverError, match=f"Docker-Content-Digest {amd64}"):
        client.manifest(NAME, "arm64")
    with pytest.raises(DriverError, match=f"Docker-Content-Digest {amd64}"):
        client.digest(NAME, "arm64")
    # By digest: the body must be that digest's, whatever the headers say.
    registry.spoiled[f"/v2/{NAME}/manifests/{amd64}"] = (200, body, {"Content-Type": IMAGE})
    with pytest.raises(DriverError, match=f"is {digest_of(body)}, not {amd64}"):
        client.manifest(NAME, amd64)


@pytest.mark.parametrize(
    "reference", ["../../other/repo/manifests/latest", "sha256:../../x", "sha256:" + "A" * 64]
)
def test_a_reference_that_is_neither_a_tag_nor_a_digest_makes_no_request(
    registry: OCIRegistry, reference: str
) -> None:
    client = Registry(registry.host)
    with pytest.raises(DriverError, match="is not a tag nor a sha256:<64 hex> digest"):
        client.manifest(NAME, reference)
    manifest = Manifest(IMAGE, _image({"digest": reference, "size": 2}), "")
    with pytest.raises(DriverError, match="digest"):
        client.config(NAME, manifest)
    assert registry.log == []


def test_an_answer_is_read_bounded_and_never_inflated(registry: OCIRegistry) -> None:
    body = _image()
    compressed = gzip.compress(body)
    registry.spoiled[f"/v2/{NAME}/manifests/gz"] = (
        200, compressed, {"Content-Type": IMAGE, "Content-Encoding": "gzip"})  # fmt: skip
    huge = b'{"schemaVersion": 2, "pad": "' + b"x" * (MAX_MANIFEST_BYTES) + b'"}'
    registry.spoiled[f"/v2/{NAME}/manifests/huge"] = (200, huge, {"Content-Type": IMAGE})
    client = Registry(registry.host)
    with pytest.raises(DriverError, match="Content-Encoding gzip"):
        client.manifest(NAME, "gz")
    with pytest.raises(DriverError, match=f"over the limit of {MAX_MANIFEST_BYTES}: not what"):
        client.manifest(NAME, "huge")


def test_a_redirect_is_followed_only_to_https(registry: OCIRegistry) -> None:
    registry.add_image(NAME, ["t"], index=False)
    elsewhere = f"http://localhost:{registry.host.rpartition(':')[2]}/v2/{NAME}/manifests/t"
    with OCIRegistry(username="me", password=PASSWORD) as server:
        server.spoiled[f"/v2/{NAME}/manifests/t"] = (307, b"", {"Location": elsewhere})
        client = Registry(server.host, credentials=Credentials("me", PASSWORD))
        with pytest.raises(DriverError, match=r"redirected .* to http://localhost:\d+/v2/.*: "
                           "only https redirects are followed") as error:  # fmt: skip
            client.manifest(NAME, "t")
    assert registry.log == []
    assert str(error.value).splitlines() == [str(error.value)]


def test_credentials_go_only_to_a_token_realm_on_the_registry_s_host() -> None:
    with OCIRegistry(username="me", password=PASSWORD) as tokens, OCIRegistry() as server:
        realm = f"http://localhost:{tokens.host.rpartition(':')[2]}/token"
        challenge = {"WWW-Authenticate": f'Bearer realm="{realm}",service="x"'}
        server.spoiled[f"/v2/{NAME}/manifests/t"] = (401, b"", challenge)
        client = Registry(server.host, credentials=Credentials("me", PASSWORD))
        with pytest.raises(DriverError, match="refused the token realm http://localhost") as err:
            client.manifest(NAME, "t")
        assert tokens.log == []
        assert "REGISTRY_TOKEN_HOSTS" in str(err.value)
        # One the user names is trusted (plain http: both on the loopback).
        trusting = Registry(server.host, credentials=Credentials("me", PASSWORD),
                            token_hosts=frozenset({"localhost"}))  # fmt: skip
        with pytest.raises(DriverError, match="still 401 with the credentials given"):
            trusting.manifest(NAME, "t")
        assert [auth for _, path, auth in tokens.log if path == "/token"] == [
            "Basic " + base64.b64encode(b"me:s3cret").decode()]  # fmt: skip


@pytest.mark.parametrize(
    ("challenge", "url"),
    [
        (
            {"realm": "https://ghcr.io/token", "service": "ghcr.io", "scope": "repository:a:pull"},
            "https://ghcr.io/token?service=ghcr.io&scope=repository%3Aa%3Apull",
        ),
        (  # no service named: none sent; the realm's own query kept; the client's scope
            {"realm": "https://auth.example/token?tenant=t", "scope": ""},
            "https://auth.example/token?tenant=t&scope=repository%3Ame%2Fdriver%3Apull%2Cpush",
        ),
    ],
)
def test_a_token_is_asked_for_as_distribution_s_client_asks(
    challenge: dict[str, str], url: str
) -> None:
    assert token_url(challenge, "repository:me/driver:pull,push") == url


def test_token_hosts_come_from_the_environment() -> None:
    assert token_hosts({"REGISTRY_TOKEN_HOSTS": "auth.docker.io, auth.example"}) == {
        "auth.docker.io", "auth.example"}  # fmt: skip
    assert token_hosts({}) == frozenset()


def test_docker_hub_s_token_service_is_its_own_and_no_other_host_is() -> None:
    """Docker Hub's API (registry-1.docker.io) names realm https://auth.docker.io/token: its
    pull secrets go there without REGISTRY_TOKEN_HOSTS; another registry's do not."""
    hub = "https://auth.docker.io/token"
    assert check_realm(hub, DOCKER_HUB_API, credentials=True, trusted=frozenset(),
                       what="docker.io") == hub  # fmt: skip
    with pytest.raises(DriverError, match="REGISTRY_TOKEN_HOSTS"):
        check_realm(hub, "ghcr.io", credentials=True, trusted=frozenset(), what="ghcr.io")
    with pytest.raises(DriverError, match="not https"):
        check_realm("http://auth.docker.io/token", DOCKER_HUB_API, credentials=True,
                    trusted=frozenset(), what="docker.io")  # fmt: skip


class _Response(io.BytesIO):
    """An HTTP response as http.client gives one, for nvidia_driver.sources.http.Answer."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        super().__init__(body)
        self.status, self.reason, self.headers = status, "", headers
        self.length = None  # no Content-Length: the body ends where it ends

    def getheaders(self) -> list[tuple[str, str]]:
        return list(self.headers.items())


class _DockerHub:
    """Docker Hub's API and token service as a client sees them: a 401 naming
    auth.docker.io, a token for the credentials, then the answer."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []  # (url, Authorization)

    def open(self, method: str, url: str, headers: dict[str, str], body: object = None) -> Answer:  # noqa: ARG002
        self.sent.append((url, headers.get("Authorization", "")))
        if url.startswith("https://auth.docker.io/token?"):
            return self._answer(url, 200, {}, b'{"token": "hub-token"}')
        if headers.get("Authorization") != "Bearer hub-token":
            challenge = ('Bearer realm="https://auth.docker.io/token",service="registry.docker.io"'
                         ',scope="repository:me/driver:pull"')  # fmt: skip
            return self._answer(url, 401, {"WWW-Authenticate": challenge})
        return self._answer(url, 404, {})

    @staticmethod
    def _answer(url: str, status: int, headers: dict[str, str], body: bytes = b"") -> Answer:
        return Answer(_Response(status, headers, body), "GET", url, Limits())  # type: ignore[arg-type]


def test_docker_hub_is_read_and_written_at_its_api_host() -> None:
    """docker.io's registry API is registry-1.docker.io (containerd remotes/docker/resolver.go
    DefaultHost; the reboot gate's RegistryRef.api_host): invoke publish --registry docker.io/me
    asks there, with the token of Docker Hub's own token service."""
    hub = _DockerHub()
    client = Registry("docker.io", credentials=Credentials("me", PASSWORD), client=hub)  # type: ignore[arg-type]
    assert client.digest("me/driver", "t") is None
    assert [url.partition("?")[0] for url, _ in hub.sent] == [
        f"https://{DOCKER_HUB_API}/v2/me/driver/manifests/t",
        "https://auth.docker.io/token",
        f"https://{DOCKER_HUB_API}/v2/me/driver/manifests/t",
    ]
    assert hub.sent[-1][1] == "Bearer hub-token"
