"""Whether a registry serves an image for an arch: the OCI distribution API, read only.

``HEAD /v2/<name>/manifests/<reference>``: 404 means not published; the digest it names is
read once (GET), and an index must list a ``linux/<arch>`` manifest, a single image manifest's
config blob must name the arch. A registry without HEAD is asked with GET. On a 401 the client
follows the ``WWW-Authenticate`` challenge (distribution's token authentication, as ghcr.io,
Docker Hub and registry:2 speak it): ``Bearer`` to the realm for a token of the challenge's
scope, with the pull secret's credentials if there are any (anonymous otherwise, which public
images need), ``Basic`` with the credentials themselves. Credentials come from the GPU
Operator's pull secrets (docker config JSON, as ``kubectl create secret docker-registry``
writes it).

Every answer is checked as the tooling's client checks it (:mod:`nvidia_driver.formats.oci`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from http import HTTPStatus

from nvidia_driver.errors import DriverError
from nvidia_driver.formats.oci import (
    ACCEPT,
    DIGEST,
    DOCKER_HUB,
    MAX_MANIFEST_BYTES,
    MAX_REDIRECTS,
    REDIRECTS,
    REPOSITORY,
    TAG,
    Credentials,
    api_host,
    check_identity,
    check_realm,
    config_digest,
    error_detail,
    index_platforms,
    kubelet_credentials,
    parse_challenge,
    plain_http,
    read_config,
    read_manifest,
    redirect_target,
    retry_after,
    token_of,
    token_url,
    verified,
)
from nvidia_driver.safetext import ANNOTATION_SHOWN, shown
from nvidia_driver.sources.download import Backoff
from nvidia_driver.sources.http import (
    OK,
    Client,
    Limits,
    Response,
    UnreachableError,
    jittered,
    retryable,
    send_retried,
)

LIMITS = Limits(timeout=20.0, deadline=60.0, max_bytes=MAX_MANIFEST_BYTES)
_HEAD_REFUSED = frozenset({405, 501})  # a registry that answers no HEAD: asked with GET
PUBLISHED_FOR = 600.0  # seconds a published verdict is kept (a held one is asked every look)
TOKEN_LIFETIME = 60.0  # seconds, when the token endpoint names none (distribution's token spec)
TOKEN_MARGIN = 5.0  # seconds before its end a token is renewed
QUIET_FIRST, QUIET_MAX = 60.0, 900.0  # seconds a registry is left alone after 429s or 5xx
MAX_KEPT = 256  # manifests whose arches are kept


class Presence(Enum):
    PUBLISHED = "published"
    MISSING = "not published yet"
    NO_ARCH = "published without this arch"


@dataclass(frozen=True)
class ImageRef:
    """``ghcr.io/me/driver:610.57.04-flatcar4593.2.5`` (or ``...@sha256:...``)."""

    host: str  # as written, with its port; docker.io when the reference names none
    name: str
    reference: str  # a tag, or a digest

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        repository, reference = _split_reference(text)
        first, _, rest = repository.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            host, name = first, rest
        else:  # distribution/reference: no host means Docker Hub, one component is library/
            host, name = DOCKER_HUB, repository if rest else f"library/{repository}"
        valid = TAG.fullmatch(reference) or DIGEST.fullmatch(reference)
        if not (valid and REPOSITORY.fullmatch(f"{host}/{name}")):
            raise DriverError(
                f"'{shown(text, ANNOTATION_SHOWN)}' is not an image reference the Operator could "
                "pull (the OCI reference grammar): check the policy's repository, image and version"
            )
        return cls(host, name, reference)

    def __str__(self) -> str:
        separator = "@" if self.reference.startswith("sha256:") else ":"
        return f"{self.host}/{self.name}{separator}{self.reference}"

    @property
    def api_host(self) -> str:
        return api_host(self.host)


def _split_reference(text: str) -> tuple[str, str]:
    repository, at, digest = text.partition("@")
    if at:
        return repository, digest
    head, colon, tag = text.rpartition(":")
    return (head, tag) if colon and "/" not in tag else (text, "")


@dataclass
class Registry:
    """Asks registries about manifests. One per gate process: its tokens, the arches of the
    manifests it has read (by digest) and the published verdicts are kept between looks, so a
    node that waits asks little (docs/gpu-operator.md, "What the gate asks a registry")."""

    client: Client = field(default_factory=lambda: Client(LIMITS))
    backoff: Backoff = field(default_factory=lambda: Backoff(attempts=3, first_delay=2.0))
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    jitter: Callable[[float], float] = jittered
    token_hosts: frozenset[str] = frozenset()  # besides the registry's own: REGISTRY_TOKEN_HOSTS
    _challenges: dict[tuple[str, str], str] = field(default_factory=dict)  # repository's
    _tokens: dict[tuple[str, str, str], tuple[str, float]] = field(default_factory=dict)
    _arches: dict[str, frozenset[str]] = field(default_factory=dict)  # manifest digest ->
    _published: dict[tuple[str, str], float] = field(default_factory=dict)  # (image, arch) ->
    _no_head: set[str] = field(default_factory=set)  # hosts whose HEAD names no digest
    _quiet: dict[str, tuple[float, int, int]] = field(default_factory=dict)  # until, n, status

    def presence(
        self, image: ImageRef, arch: str, keyring: Sequence[tuple[str, Credentials]] = ()
    ) -> Presence:
        """Whether ``image`` is published for ``linux/<arch>``; a DriverError if it cannot tell.
        ``keyring``: the pull secrets' (:func:`kubelet_keyring`). Asked with each credentials
        the kubelet would try, in its order (anonymously when none match), as the kubelet pulls
        with the first that serves the image; else the first one's answer."""
        seen = self._published.get((str(image), arch))
        if seen is not None and self.clock() - seen < PUBLISHED_FOR:
            return Presence.PUBLISHED
        tried = kubelet_credentials(keyring, f"{image.host}/{image.name}")
        answers: list[Presence | DriverError] = []
        for basic in [credentials.basic for credentials in tried] or [""]:
            try:
                self._not_quiet(image)
                arches = self._arches_of(image, basic)
            except DriverError as exc:
                answers.append(exc)
                continue
            if arches is not None and arch in arches:
                self._published[str(image), arch] = self.clock()
                return Presence.PUBLISHED
            answers.append(Presence.MISSING if arches is None else Presence.NO_ARCH)
        first = answers[0]
        if isinstance(first, DriverError):
            raise first
        return first

    def _arches_of(self, image: ImageRef, basic: str) -> frozenset[str] | None:
        """The linux arches the manifest serves; None when it is not published. A HEAD names
        the digest, whose arches are read once (HEADs do not count against Docker Hub's pull
        limit, GETs do); a registry whose HEAD names none is asked with GET."""
        path = f"manifests/{image.reference}"
        if image.api_host not in self._no_head:
            response = self._get(image, path, ACCEPT, basic, method="HEAD", also=_HEAD_REFUSED)
            if response.status == HTTPStatus.NOT_FOUND:
                return None
            digest = response.header("Docker-Content-Digest")
            if DIGEST.fullmatch(digest):
                if digest not in self._arches:
                    if len(self._arches) >= MAX_KEPT:
                        self._arches.clear()
                    manifest = self._get(image, f"manifests/{digest}", ACCEPT, basic)
                    self._arches[digest] = self._read_arches(image, manifest, basic, digest)
                return self._arches[digest]
            self._no_head.add(image.api_host)
        response = self._get(image, path, ACCEPT, basic)
        if response.status == HTTPStatus.NOT_FOUND:
            return None
        return self._read_arches(image, response, basic, image.reference)

    def _read_arches(
        self, image: ImageRef, response: Response, basic: str, reference: str
    ) -> frozenset[str]:
        """The linux arches of an index, or the arch in a single image's config."""
        if response.status == HTTPStatus.NOT_FOUND:
            raise DriverError(f"{image}: the manifest the registry named, {reference}, is not "
                              "served")  # fmt: skip
        manifest = read_manifest(
            response.body,
            content_type=response.header("Content-Type"),
            claimed=response.header("Docker-Content-Digest"),
            reference=reference,
            what=f"{image}: the registry's manifest",
        )
        if manifest.is_index:
            return frozenset(arch for os, arch in index_platforms(manifest) if os == "linux")
        digest = config_digest(manifest, f"{image}: the manifest's config")  # it goes in a URL
        what = f"{image}: the config blob {digest}"
        architecture = read_config(self._blob(image, digest, basic).body, digest, what).get(
            "architecture"
        )
        return frozenset({architecture} if isinstance(architecture, str) else ())

    def _blob(self, image: ImageRef, digest: str, basic: str) -> Response:
        """A blob, wherever the registry sends it: ghcr.io and Docker Hub answer 307 to their
        storage host. Followed to https only, with no credentials (they are the registry's),
        and what arrives must be the digest asked for."""
        url = f"{self._url(image)}/blobs/{digest}"
        response = self._get(image, f"blobs/{digest}", "*/*", basic, also=REDIRECTS)
        for _ in range(MAX_REDIRECTS):
            if response.status not in REDIRECTS:
                break
            what = f"{image}: the registry redirected the blob {digest}"
            url = redirect_target(url, response.header("Location"), image.api_host, what)
            response = self._send(image, "GET", url, "*/*", "")
        if response.status not in OK:
            raise DriverError(f"{image}: the blob {digest} answered {response.status}")
        verified(response.body, digest, f"{image}: the blob {digest}")
        return response

    # --- a registry that answered 429 or 5xx is left alone a while ---------------------------

    def _not_quiet(self, image: ImageRef) -> None:
        until, _, status = self._quiet.get(image.api_host, (0.0, 0, 0))
        left = until - self.clock()
        if left > 0:
            raise DriverError(
                f"{image}: the registry answered {status} and its retries ran out; the gate "
                f"asks it again in {left:.0f} s"
            )

    def _answered(self, image: ImageRef, response: Response) -> None:
        """Leaves the registry alone for a growing, jittered while after retries that ended in
        429 or 5xx (at least what its Retry-After asked), so that a fleet of gates backs off."""
        if not retryable(response):
            self._quiet.pop(image.api_host, None)
            return
        _, times, _ = self._quiet.get(image.api_host, (0.0, 0, 0))
        wait = self.jitter(min(QUIET_FIRST * 2**times, QUIET_MAX))
        wait = max(wait, min(retry_after(response.header("Retry-After")) or 0.0, QUIET_MAX))
        self._quiet[image.api_host] = (self.clock() + wait, times + 1, response.status)

    # --- the exchange, with the token dance ------------------------------------------------

    def _url(self, image: ImageRef) -> str:
        scheme = "http" if plain_http(image.api_host) else "https"
        return f"{scheme}://{image.api_host}/v2/{image.name}"

    def _get(
        self,
        image: ImageRef,
        path: str,
        accept: str,
        basic: str,
        *,
        method: str = "GET",
        also: frozenset[int] = frozenset(),
    ) -> Response:
        """The answer if OK, 404 or one of ``also``; a DriverError otherwise."""
        url = f"{self._url(image)}/{path}"
        response = self._send(image, method, url, accept, self._authorization(image, basic))
        if response.status == HTTPStatus.UNAUTHORIZED:
            self._challenges[image.host, image.name] = response.header("WWW-Authenticate")
            self._tokens.pop((image.host, image.name, basic), None)
            response = self._send(image, method, url, accept, self._authorization(image, basic))
        self._answered(image, response)
        if response.status in OK or response.status in {HTTPStatus.NOT_FOUND, *also}:
            return response
        raise DriverError(
            f"{image}: the registry answered {response.status}{error_detail(response.body)}"
        )

    def _send(
        self, image: ImageRef, method: str, url: str, accept: str, authorization: str
    ) -> Response:
        headers = {"Accept": accept, "Accept-Encoding": "identity"}
        if authorization:
            headers["Authorization"] = authorization
        try:
            response = send_retried(
                lambda: self.client.send(method, url, headers),
                self.backoff,
                self.sleep,
                self.jitter,
            )
        except UnreachableError as exc:
            raise DriverError(f"{exc}; check the node's network and proxy") from None
        if response.status in OK:
            check_identity(response.header("Content-Encoding"), f"{image}: the registry's answer")
        return response

    def _authorization(self, image: ImageRef, basic: str) -> str:
        """The kept token while it lives, else a new one for the repository's challenge (no
        401 first when the challenge is known); "" before any challenge."""
        key = (image.host, image.name, basic)
        kept = self._tokens.get(key)
        if kept is not None and self.clock() < kept[1]:
            return kept[0]
        challenge = self._challenges.get((image.host, image.name))
        if challenge is None:
            return ""
        authorization, lifetime = self._authorize(image, challenge, basic)
        self._tokens[key] = (authorization, self.clock() + lifetime)
        return authorization

    def _authorize(self, image: ImageRef, header: str, basic: str) -> tuple[str, float]:
        """The Authorization a challenge asks for, and how many seconds it may be reused."""
        kind, fields = parse_challenge(header)
        if kind == "basic":
            if not basic:
                raise DriverError(f"{image}: the registry wants credentials: {_SET_PULL_SECRETS}")
            return basic, math.inf
        realm = fields.get("realm", "")
        if kind != "bearer" or not realm:
            raise DriverError(
                f"{image}: the registry's challenge '{shown(header, ANNOTATION_SHOWN)}' is unknown"
            )
        check_realm(realm, image.api_host, credentials=bool(basic), trusted=self.token_hosts,
                    what=f"{image}: the registry")  # fmt: skip
        url = token_url(fields, f"repository:{image.name}:pull")
        response = self._send(image, "GET", url, "application/json", basic)
        if response.status not in OK:
            why = "refused the pull secret's credentials" if basic else "gives no anonymous token"
            raise DriverError(
                f"{image}: the registry {why}, {response.status}"
                f"{error_detail(response.body)}: {_SET_PULL_SECRETS}"
            )
        token, lifetime = token_of(response.body, f"{image}: the registry's token endpoint")
        return f"Bearer {token}", max((lifetime or TOKEN_LIFETIME) - TOKEN_MARGIN, 0.0)


_SET_PULL_SECRETS = (
    "set the GPU Operator's driver.imagePullSecrets and let the gate read them "
    "(docs/gpu-operator.md, the reboot gate's RBAC)"
)
