"""A small OCI distribution API client (through ``requests``): which tags exist, tag copies, and
blobs, down and up (:mod:`gdc.compression` rewrites layers with them).

Registries on 127.0.0.1 or localhost are spoken to over plain http, all others over https.
Answers 429 and 5xx are retried, a bounded number of times with exponential backoff, honouring
``Retry-After`` (seconds or an HTTP date) up to :data:`MAX_RETRY_AFTER_SECONDS`, and only while
the client's :class:`RetryBudget` lasts (``invoke publish`` gives each image its own): past it
the answer stands, and a 429, the registry's or its token service's, is reported as a rate
limit, never as a credentials problem.

On a 401 the client follows the ``WWW-Authenticate`` challenge: for ``Bearer`` (ghcr.io, Docker
Hub, registry:2 with token auth) it asks the realm for a token for the challenge's service and
scope, for ``Basic`` it sends the credentials. Credentials, first found wins:

1. ``REGISTRY_USERNAME`` and ``REGISTRY_PASSWORD``;
2. the registry's entry in the docker config (``$DOCKER_CONFIG/config.json`` or
   ``~/.docker/config.json``, as ``docker login`` writes it without a credential helper), read
   as the reboot gate reads a pull secret (``nvidia_driver.gate.registry``);
3. for ghcr.io, ``GITHUB_TOKEN`` (user ``$GITHUB_ACTOR``);
4. none: anonymous tokens, enough to read public images.

Blobs move through a session of their own, whose deadline (:data:`BLOB_DEADLINE_SECONDS`) fits a
layer of gigabytes; a download is bounded by the size its descriptor gives and checked against
its digest before anyone reads it. An upload is monolithic (a POST for a location, one PUT of the
bytes with their digest); the registry's credentials go only to a location on the registry
itself.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import time
import urllib.parse
from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import urllib3.exceptions

from gdc.transport import Limits, deadline_session
from nvidia_driver.gate.http import retry_after
from nvidia_driver.gate.registry import ACCEPT as MANIFEST_ACCEPT
from nvidia_driver.gate.registry import (
    INDEX_TYPES,
    Credentials,
    credentials_from_docker_config,
    parse_challenge,
    plain_http,
)
from nvidia_driver.safetext import shown
from nvidia_driver.sources.exchange import ExchangeError

TIMEOUT_SECONDS = 60
RETRIES = 4  # after the first attempt: 1 + 2 + 4 + 8 s of backoff at most, Retry-After aside
BACKOFF_SECONDS = 1.0
MAX_RETRY_AFTER_SECONDS = 60.0
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
BLOB_DEADLINE_SECONDS = 3600.0  # one blob, down or up: a precompiled image's layer is ~1 GB
CHUNK_BYTES = 1 << 20
SHA256_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_HOST = re.compile(r"[^/]*[.:][^/]*|localhost")
_NOT_FOUND = 404
_UNAUTHORIZED = 401
_TOO_MANY_REQUESTS = 429
_SERVER_ERROR = 500


class RegistryError(RuntimeError):
    """The registry could not answer; the message says which, why and what to do."""


@dataclass
class RetryBudget:
    """The seconds a client may still wait between retries; a wait that does not fit is skipped."""

    seconds: float = math.inf
    spent: float = 0.0

    def spend(self, wait: float) -> bool:
        if self.spent + wait > self.seconds:
            return False
        self.spent += wait
        return True

    def waited(self) -> str:
        """`` after N s of retries`` for a message, or "" when nothing was waited."""
        return f" after {self.spent:.0f} s of retries" if self.spent else ""


@dataclass(frozen=True)
class Repository:
    """``ghcr.io/me/driver`` -> host ``ghcr.io``, name ``me/driver``."""

    host: str
    name: str

    @classmethod
    def parse(cls, repository: str) -> Repository:
        host, _, name = repository.partition("/")
        if not name or not _HOST.fullmatch(host):
            raise RegistryError(
                f"{repository!r} names no registry host: pass --registry with one, "
                "e.g. ghcr.io/<owner> or 127.0.0.1:5000/gdc"
            )
        return cls(host, name)

    def __str__(self) -> str:
        return f"{self.host}/{self.name}"


@dataclass(frozen=True)
class Manifest:
    media_type: str
    body: bytes
    digest: str

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEX_TYPES

    def json(self) -> dict[str, Any]:
        document = json.loads(self.body)
        return document if isinstance(document, dict) else {}


def docker_config_path(env: Mapping[str, str]) -> Path:
    directory = env.get("DOCKER_CONFIG")
    return Path(directory) / "config.json" if directory else Path.home() / ".docker/config.json"


def credentials_for(
    host: str, env: Mapping[str, str], config: Path | None = None
) -> Credentials | None:
    """The credentials for host, from the environment or the docker config (module docstring)."""
    if env.get("REGISTRY_USERNAME") and env.get("REGISTRY_PASSWORD"):
        return Credentials(env["REGISTRY_USERNAME"], env["REGISTRY_PASSWORD"])
    from_config = _docker_config_auth(host, config or docker_config_path(env))
    if from_config:
        return from_config
    if host == "ghcr.io" and env.get("GITHUB_TOKEN"):
        return Credentials(env.get("GITHUB_ACTOR") or "github-actions", env["GITHUB_TOKEN"])
    return None


def _docker_config_auth(host: str, config: Path) -> Credentials | None:
    try:
        document = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict):
        return None
    return credentials_from_docker_config(document).get(host)


def _one_line(text: str) -> str:
    """A registry's words on one line: blanks collapsed, every other control character escaped
    (nvidia_driver.safetext), 200 characters at most."""
    return shown(" ".join(text.split()))


def _first_line(error: Exception) -> str:
    return _one_line(str(error).splitlines()[0]) if str(error).strip() else type(error).__name__


class Registry:
    """One registry host; ``session`` is injectable (tests pass adapters or a loopback URL)."""

    def __init__(
        self,
        host: str,
        *,
        credentials: Credentials | None = None,
        session: requests.Session | None = None,
        blob_session: requests.Session | None = None,
        retries: int = RETRIES,
        sleep: Callable[[float], None] = time.sleep,
        retry_budget: float = math.inf,
    ) -> None:
        self.host = host
        self.base_url = f"{'http' if plain_http(host) else 'https'}://{host}"
        self.credentials = credentials
        self.session = session or deadline_session()  # each request within one deadline
        # Blobs: a longer deadline, the same session when one is given (tests, adapters).
        self.blob_session = (
            blob_session or session or deadline_session(Limits(deadline=BLOB_DEADLINE_SECONDS))
        )
        self.retries = retries
        self.sleep = sleep
        self.budget = RetryBudget(retry_budget)  # the caller may replace it (per image)
        self.requests = 0  # sent, retries included: what a run cost
        self.retried = 0
        self._auth: dict[str, str] = {}  # "<name>:<actions>" -> Authorization header

    # --- the API ---------------------------------------------------------------------------

    def digest(self, name: str, reference: str) -> str | None:
        """The manifest digest of name:reference, or None when there is no such tag."""
        response = self._send("HEAD", name, f"manifests/{reference}", "pull")
        if response.status_code == _NOT_FOUND:
            return None
        self._check(response, "HEAD", name, reference)
        digest = response.headers.get("Docker-Content-Digest")
        return digest or self.manifest(name, reference).digest

    def manifest(self, name: str, reference: str) -> Manifest:
        response = self._send("GET", name, f"manifests/{reference}", "pull")
        self._check(response, "GET", name, reference)
        body = response.content
        media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
        digest = response.headers.get("Docker-Content-Digest") or (
            "sha256:" + hashlib.sha256(body).hexdigest()
        )
        return Manifest(media_type or str(json.loads(body).get("mediaType", "")), body, digest)

    def check(self, name: str) -> None:
        """Reach the registry and get read access to name, once, before anything is planned."""
        self.digest(name, "gdc-publish-probe")

    def config(self, name: str, manifest: Manifest) -> dict[str, Any]:
        """The image config an image manifest points at (labels, os, architecture)."""
        digest = str(manifest.json().get("config", {}).get("digest", ""))
        response = self._send("GET", name, f"blobs/{digest}", "pull")
        self._check(response, "GET", name, digest)
        try:
            config = response.json()
        except ValueError:
            raise RegistryError(f"the registry {self.host} returned a config blob {digest} "
                                "that is not JSON") from None  # fmt: skip
        return config if isinstance(config, dict) else {}

    def platforms(self, name: str, reference: str) -> frozenset[str]:
        """``os/arch`` of each image behind name:reference (attestation entries left out)."""
        manifest = self.manifest(name, reference)
        document = manifest.json()
        if manifest.is_index:
            return frozenset(
                f"{p.get('os')}/{p.get('architecture')}"
                for entry in document.get("manifests", [])
                if isinstance(p := entry.get("platform"), dict) and p.get("os") != "unknown"
            )
        config_digest = str(document.get("config", {}).get("digest", ""))
        response = self._send("GET", name, f"blobs/{config_digest}", "pull")
        self._check(response, "GET", name, config_digest)
        config = response.json()
        return frozenset({f"{config.get('os')}/{config.get('architecture')}"})

    def put_manifest(self, name: str, tag: str, manifest: Manifest) -> str:
        """Tag manifest as name:tag (a copy within the repository: no blob moves)."""
        response = self._send("PUT", name, f"manifests/{tag}", "pull,push", data=manifest.body,
                              headers={"Content-Type": manifest.media_type})  # fmt: skip
        self._check(response, "PUT", name, tag)
        return response.headers.get("Docker-Content-Digest") or manifest.digest

    def blob_exists(self, name: str, digest: str) -> bool:
        """Whether the registry has blob digest in name (a HEAD)."""
        response = self._send("HEAD", name, f"blobs/{_checked(digest)}", "pull")
        if response.status_code == _NOT_FOUND:
            return False
        self._check(response, "HEAD", name, digest)
        return True

    def fetch_blob(self, name: str, digest: str, size: int, destination: Path) -> None:
        """Write blob digest of name to destination: at most size bytes, streamed, its size and
        SHA-256 checked before this returns (a mismatch leaves no file)."""
        _checked(digest)
        response = self._send("GET", name, f"blobs/{digest}", "pull", stream=True,
                              session=self.blob_session)  # fmt: skip
        with closing(response):
            self._check(response, "GET", name, digest)
            hasher, count = hashlib.sha256(), 0
            try:
                with destination.open("wb") as out:
                    for chunk in response.raw.stream(CHUNK_BYTES, decode_content=False):
                        count += len(chunk)
                        if count > size:
                            break
                        hasher.update(chunk)
                        out.write(chunk)
            except (requests.RequestException, urllib3.exceptions.HTTPError, ExchangeError,
                    OSError) as exc:  # fmt: skip
                destination.unlink(missing_ok=True)
                raise RegistryError(f"the registry {self.host} broke off blob {digest} of {name} "
                                    f"({_first_line(exc)}): retry") from None  # fmt: skip
        found = "sha256:" + hasher.hexdigest()
        if count != size or found != digest:
            destination.unlink(missing_ok=True)
            got = f"more than {size} bytes" if count > size else f"{count} bytes, {found}"
            raise RegistryError(f"the registry {self.host} sent {got} for blob {digest} of "
                                f"{name} ({size} bytes): refused, nothing read from it; the "
                                "registry's copy is damaged or not what its manifest "
                                "names")  # fmt: skip

    def upload_blob(self, name: str, path: Path, digest: str) -> None:
        """Upload the file path as blob digest of name: POST for a location, then one PUT."""
        _checked(digest)
        started = self._send("POST", name, "blobs/uploads/", "pull,push",
                             headers={"Content-Length": "0"})  # fmt: skip
        self._check(started, "POST", name, "blobs/uploads/")
        location = started.headers.get("Location", "")
        if not location:
            raise RegistryError(f"the registry {self.host} started an upload to {name} but gave "
                                "no Location: check the registry")  # fmt: skip
        url = urllib.parse.urljoin(f"{self.base_url}/v2/{name}/blobs/uploads/", location)
        url += f"{'&' if urllib.parse.urlsplit(url).query else '?'}digest={digest}"
        with path.open("rb") as body:
            response = self._send("PUT", name, "", "pull,push", url=url, data=body,
                                  headers={"Content-Type": "application/octet-stream",
                                           "Content-Length": str(path.stat().st_size)},
                                  session=self.blob_session)  # fmt: skip
        self._check(response, "PUT", name, digest)

    # --- transport and auth ----------------------------------------------------------------

    def _send(
        self, method: str, name: str, path: str, actions: str, *, url: str = "", **kwargs: Any
    ) -> requests.Response:
        """One request to /v2/<name>/<path>, or to url (an upload's location). The credentials
        go to this registry only: a location on another host is sent none."""
        url = url or f"{self.base_url}/v2/{name}/{path}"
        ours = urllib.parse.urlsplit(url).netloc == urllib.parse.urlsplit(self.base_url).netloc
        headers = {"Accept": MANIFEST_ACCEPT, **kwargs.pop("headers", {})}
        key = f"{name}:{actions}"
        response = self._request(method, url, headers=self._with_auth(headers, key, ours),
                                 **kwargs)  # fmt: skip
        if response.status_code == _UNAUTHORIZED and ours:
            response.close()
            self._auth[key] = self._authorize(response, name, actions)
            response = self._request(method, url, headers=self._with_auth(headers, key), **kwargs)
        return response

    def _with_auth(self, headers: dict[str, str], key: str, ours: bool = True) -> dict[str, str]:
        if ours and key in self._auth:
            return {**headers, "Authorization": self._auth[key]}
        return headers

    def _request(
        self, method: str, url: str, *, session: requests.Session | None = None, **kwargs: Any
    ) -> requests.Response:
        body = kwargs.get("data")
        for attempt in range(self.retries + 1):
            self.requests += 1
            if isinstance(body, io.IOBase):  # a file sent again is sent from its start
                body.seek(0)
            try:
                response = (session or self.session).request(method, url,
                                                             timeout=TIMEOUT_SECONDS,
                                                             **kwargs)  # fmt: skip
            except requests.RequestException as exc:
                raise RegistryError(
                    f"cannot reach the registry {self.host} ({_first_line(exc)}): check "
                    "--registry and that the registry is up"
                ) from None
            if response.status_code not in RETRIED_STATUSES or attempt == self.retries:
                return response
            wait = _retry_after(response, BACKOFF_SECONDS * 2**attempt)
            if wait > MAX_RETRY_AFTER_SECONDS or not self.budget.spend(wait):
                return response  # the caller says what the registry answered
            response.close()  # a streamed answer holds its connection until closed
            self.retried += 1
            self.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    def _authorize(self, challenge: requests.Response, name: str, actions: str) -> str:
        header = challenge.headers.get("WWW-Authenticate", "")
        scheme, params = parse_challenge(header)
        if scheme == "basic" and self.credentials:
            return self.credentials.basic
        if scheme != "bearer" or "realm" not in params:
            raise self._denied(f"it asks for {header or 'authentication'!r}")
        query = {"service": params.get("service", self.host),
                 "scope": params.get("scope", f"repository:{name}:{actions}")}  # fmt: skip
        auth = (self.credentials.username, self.credentials.password) if self.credentials else None
        response = self._request("GET", params["realm"], params=query, auth=auth)
        realm, reason = _one_line(params["realm"]), _one_line(response.reason)
        answered = f"its token service {realm} answered {response.status_code} {reason}"
        if response.status_code == _TOO_MANY_REQUESTS:
            raise _rate_limited(f"the registry {self.host}'s token service {realm} answered 429 "
                                f"{reason}{self.budget.waited()}")  # fmt: skip
        if response.status_code >= _SERVER_ERROR:
            raise RegistryError(f"the registry {self.host} could not authorize: {answered}"
                                f"{self.budget.waited()}; the registry is in trouble, retry "
                                "later")  # fmt: skip
        if not response.ok:
            raise self._denied(answered)
        try:
            document = response.json()
            token = document.get("token") or document.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise self._denied(f"its token service {realm} returned no token")
        return f"Bearer {token}"

    def _denied(self, why: str) -> RegistryError:
        return RegistryError(
            f"the registry {self.host} refused access: {why}; set REGISTRY_USERNAME and "
            "REGISTRY_PASSWORD (for ghcr.io: GITHUB_TOKEN with packages: write) or docker login"
        )

    def _check(self, response: requests.Response, method: str, name: str, ref: str) -> None:
        if response.ok:
            return
        if response.status_code == _UNAUTHORIZED:
            raise self._denied(f"{method} {name}:{ref} is still 401 with the credentials given")
        reason = _one_line(response.reason)  # the status line's: the registry's words
        if response.status_code == _TOO_MANY_REQUESTS:
            raise _rate_limited(f"the registry {self.host} answered {method} {name}:{ref} with "
                                f"429 {reason}{self.budget.waited()}")  # fmt: skip
        detail = _error_detail(response)
        raise RegistryError(
            f"the registry {self.host} answered {method} {name}:{ref} with "
            f"{response.status_code} {reason}{detail}: check the registry and the "
            "credentials' permissions"
        )


def _checked(digest: str) -> str:
    """digest, if it is a SHA-256 digest (the only kind this client can check)."""
    if not SHA256_DIGEST.fullmatch(digest):
        raise RegistryError(f"{_one_line(digest)!r} is not a sha256:<64 hex> digest: only "
                            "SHA-256 blobs are fetched or uploaded")  # fmt: skip
    return digest


def _rate_limited(what: str) -> RegistryError:
    return RegistryError(f"{what}: rate-limited by the registry (HTTP 429), retry later")


def _retry_after(response: requests.Response, backoff: float) -> float:
    """Seconds to wait before the next attempt: Retry-After when the answer has one."""
    seconds = retry_after(response.headers.get("Retry-After", ""))
    return backoff if seconds is None else seconds


def _error_detail(response: requests.Response) -> str:
    """The first error of an OCI error body, as ``(CODE: message)``."""
    try:
        errors = response.json().get("errors", [])
        first = errors[0]
        detail = _one_line(f"{first.get('code')}: {first.get('message')}")
    except (ValueError, AttributeError, IndexError, TypeError):
        return ""
    return f" ({detail})"
