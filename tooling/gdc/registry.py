"""A small OCI distribution API client (through ``requests``): which tags exist, tag copies, and
blobs, down and up (:mod:`gdc.compression` rewrites layers with them).

Registries on 127.0.0.1 or localhost are spoken to over plain http, all others over https.
Answers 429 and 5xx are retried, a bounded number of times with exponential backoff, honouring
``Retry-After`` (seconds or an HTTP date) up to :data:`MAX_RETRY_AFTER_SECONDS`, and only while
the client's :class:`RetryBudget` lasts (``invoke publish`` gives its whole run one): past it
the answer stands, and a 429, the registry's or its token service's, is reported as a rate
limit, never as a credentials problem.

Every answer is read as sent (``Accept-Encoding: identity``; one that comes compressed anyway is
refused, never inflated) and within a byte bound: :data:`MAX_MANIFEST_BYTES` for a manifest,
:data:`MAX_CONFIG_BYTES` for a config blob, :data:`MAX_ANSWER_BYTES` for a token or an error.
A manifest is a JSON object of a known media type (:data:`MANIFEST_TYPES`, the body's
``mediaType`` agreeing with ``Content-Type``) whose config, layers or entries are JSON objects;
its digest is its bytes' (a ``Docker-Content-Digest`` that differs is refused, as is a manifest
asked for by digest whose bytes are another's); a config blob is checked against its digest
too. A reference is a tag or a digest before it becomes part of a URL. Redirects are followed
only to https (or within a loopback registry), with no credentials but to the registry itself.

On a 401 the client follows the ``WWW-Authenticate`` challenge: for ``Bearer`` (ghcr.io, Docker
Hub, registry:2 with token auth) it asks the realm for a token for the challenge's service and
scope, for ``Basic`` it sends the credentials. The realm must be https (plain http only when it
and the registry are on the loopback, :func:`~nvidia_driver.gate.registry.plain_http`), and it
is sent credentials only on the registry's own host or a host ``REGISTRY_TOKEN_HOSTS`` names
(comma-separated: Docker Hub's is ``auth.docker.io``). Credentials, first found wins:

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

import errno
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
    IMAGE_TYPES,
    INDEX_TYPES,
    Credentials,
    credentials_from_docker_config,
    parse_challenge,
    plain_http,
)
from nvidia_driver.gate.registry import LIMITS as GATE_LIMITS
from nvidia_driver.safetext import shown
from nvidia_driver.sources.exchange import ExchangeError
from nvidia_driver.sources.gpuoperator import DIGEST, TAG

TIMEOUT_SECONDS = 60
RETRIES = 4  # after the first attempt: 1 + 2 + 4 + 8 s of backoff at most, Retry-After aside
BACKOFF_SECONDS = 1.0
MAX_RETRY_AFTER_SECONDS = 60.0
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
BLOB_DEADLINE_SECONDS = 3600.0  # one blob, down or up: a precompiled image's layer is ~1 GB
CHUNK_BYTES = 1 << 20
MANIFEST_TYPES = (*INDEX_TYPES, *IMAGE_TYPES)
MAX_MANIFEST_BYTES = GATE_LIMITS.max_bytes  # as the reboot gate reads one
MAX_CONFIG_BYTES = 4 << 20
MAX_ANSWER_BYTES = 1 << 20  # a token, an error
MAX_REDIRECTS = 5
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

    def stated(self) -> str:
        """What was spent of it, for a run's last lines."""
        return f"{self.spent:.0f} of the run's {self.seconds:.0f} s retry budget waited"


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


def token_hosts(env: Mapping[str, str]) -> frozenset[str]:
    """The token services' hosts the user trusts with credentials besides the registry's own
    (``REGISTRY_TOKEN_HOSTS``, comma-separated)."""
    return frozenset(h.strip() for h in env.get("REGISTRY_TOKEN_HOSTS", "").split(",") if h.strip())


def _docker_config_auth(host: str, config: Path) -> Credentials | None:
    try:
        document = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict):
        return None
    return credentials_from_docker_config(document).get(host)


def full_disk(error: BaseException, path: Path) -> RegistryError | None:
    """The one line for a write to path that failed for want of space, else None."""
    if not isinstance(error, OSError) or error.errno not in {errno.ENOSPC, errno.EDQUOT}:
        return None
    return RegistryError(f"no space left on the disk of {path} ({_first_line(error)}): free "
                         "space there, or set TMPDIR to a larger disk")  # fmt: skip


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
        token_hosts: frozenset[str] = frozenset(),
    ) -> None:
        self.host = host
        self.token_hosts = token_hosts
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
        """The manifest digest of name:reference (its bytes'), or None when there is no such tag."""
        found = self.find(name, reference)
        return found.digest if found else None

    def find(self, name: str, reference: str) -> Manifest | None:
        """name:reference's manifest, checked (module docstring), or None when there is none."""
        return self._manifest_of(name, reference, missing_ok=True)

    def manifest(self, name: str, reference: str) -> Manifest:
        manifest = self._manifest_of(name, reference, missing_ok=False)
        assert manifest is not None  # a 404 was refused by _check
        return manifest

    def check(self, name: str) -> None:
        """Reach the registry and get read access to name, once, before anything is planned."""
        self.digest(name, "gdc-publish-probe")

    def config(self, name: str, manifest: Manifest) -> dict[str, Any]:
        """The image config an image manifest points at (labels, os, architecture), checked
        against its digest."""
        descriptor = manifest.json().get("config")
        digest = str(descriptor.get("digest", "")) if isinstance(descriptor, dict) else ""
        response = self._send("GET", name, f"blobs/{checked_digest(digest)}", "pull")
        self._check(response, "GET", name, digest)
        body = self._body(response, MAX_CONFIG_BYTES, f"the config blob {digest} of {name}")
        if _digest(body) != digest:
            raise RegistryError(f"the registry {self.host} sent {_digest(body)} for the config "
                                f"blob {digest} of {name}: refused; the registry's copy is "
                                "damaged or not what its manifest names")  # fmt: skip
        try:
            config = json.loads(body)
        except ValueError:
            config = None
        if not isinstance(config, dict):
            raise RegistryError(f"the registry {self.host} returned a config blob {digest} of "
                                f"{name} that is not a JSON object: refused")  # fmt: skip
        return config

    def platforms(self, name: str, reference: str) -> frozenset[str]:
        """``os/arch`` of each image behind name:reference (attestation entries left out)."""
        manifest = self.manifest(name, reference)
        document = manifest.json()
        if manifest.is_index:
            return frozenset(
                f"{p.get('os')}/{p.get('architecture')}"
                for entry in document["manifests"]
                if isinstance(p := entry.get("platform"), dict) and p.get("os") != "unknown"
            )
        config = self.config(name, manifest)
        return frozenset({f"{config.get('os')}/{config.get('architecture')}"})

    def put_manifest(self, name: str, tag: str, manifest: Manifest) -> str:
        """Tag manifest as name:tag (a copy within the repository: no blob moves)."""
        response = self._send("PUT", name, f"manifests/{_reference(tag)}", "pull,push",
                              data=manifest.body,
                              headers={"Content-Type": manifest.media_type})  # fmt: skip
        self._check(response, "PUT", name, tag)
        response.close()
        return response.headers.get("Docker-Content-Digest") or manifest.digest

    def blob_exists(self, name: str, digest: str) -> bool:
        """Whether the registry has blob digest in name (a HEAD)."""
        response = self._send("HEAD", name, f"blobs/{checked_digest(digest)}", "pull")
        response.close()
        if response.status_code == _NOT_FOUND:
            return False
        self._check(response, "HEAD", name, digest)
        return True

    def fetch_blob(self, name: str, digest: str, size: int, destination: Path) -> None:
        """Write blob digest of name to destination: at most size bytes, streamed, its size and
        SHA-256 checked before this returns (a mismatch leaves no file)."""
        response = self._send("GET", name, f"blobs/{checked_digest(digest)}", "pull",
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
                broke = RegistryError(f"the registry {self.host} broke off blob {digest} of "
                                      f"{name} ({_first_line(exc)}): retry")  # fmt: skip
                raise full_disk(exc, destination) or broke from None
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
        checked_digest(digest)
        started = self._send("POST", name, "blobs/uploads/", "pull,push",
                             headers={"Content-Length": "0"})  # fmt: skip
        self._check(started, "POST", name, "blobs/uploads/")
        started.close()
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
        response.close()

    # --- reading an answer -----------------------------------------------------------------

    def _manifest_of(self, name: str, reference: str, *, missing_ok: bool) -> Manifest | None:
        response = self._send("GET", name, f"manifests/{_reference(reference)}", "pull")
        if response.status_code == _NOT_FOUND and missing_ok:
            response.close()
            return None
        self._check(response, "GET", name, reference)
        what = f"{name}{'@' if reference.startswith('sha256:') else ':'}{reference}"
        body = self._body(response, MAX_MANIFEST_BYTES, f"the manifest {what}")
        return self._manifest(what, reference, body, response.headers)

    def _body(self, response: requests.Response, limit: int, what: str) -> bytes:
        """response's body as sent, at most limit bytes; the response is closed."""
        with closing(response):
            encoding = response.headers.get("Content-Encoding", "").strip().lower()
            if encoding not in {"", "identity"}:
                raise RegistryError(f"the registry {self.host} sent {what} with Content-Encoding "
                                    f"{_one_line(encoding)}, though asked for none: refused, "
                                    "not inflated; check the registry or the proxy before "
                                    "it")  # fmt: skip
            chunks, count = [], 0
            try:
                for chunk in response.raw.stream(CHUNK_BYTES, decode_content=False):
                    count += len(chunk)
                    if count > limit:
                        raise RegistryError(f"the registry {self.host} sent more than {limit} "
                                            f"bytes for {what}: refused")  # fmt: skip
                    chunks.append(chunk)
            except (requests.RequestException, urllib3.exceptions.HTTPError, ExchangeError,
                    OSError) as exc:  # fmt: skip
                raise RegistryError(f"the registry {self.host} broke off {what} "
                                    f"({_first_line(exc)}): retry") from None  # fmt: skip
        return b"".join(chunks)

    def _manifest(self, what: str, reference: str, body: bytes,
                  headers: Mapping[str, str]) -> Manifest:  # fmt: skip
        """The manifest body, once its digest, media type and shape are known good."""
        digest = _digest(body)
        answered = f"the registry {self.host} answered {what} with a manifest"
        if reference.startswith("sha256:") and digest != reference:
            raise RegistryError(f"{answered} that is {digest}, not {reference}: refused; the "
                                "registry's copy is damaged")  # fmt: skip
        claimed = headers.get("Docker-Content-Digest", "")
        if claimed and claimed != digest:
            raise RegistryError(f"{answered} that is {digest}, though its Docker-Content-Digest "
                                f"{_one_line(claimed)} names another: refused; check the "
                                "registry and any cache before it")  # fmt: skip
        header = headers.get("Content-Type", "").split(";")[0].strip()
        try:
            document = json.loads(body)
        except ValueError:
            raise RegistryError(f"{answered} that is not JSON (Content-Type "
                                f"{_one_line(header) or 'none'}): check the registry, or the "
                                "proxy before it") from None  # fmt: skip
        if not isinstance(document, dict):
            raise RegistryError(f"{answered} that is not a JSON object: refused")
        declared = document.get("mediaType")
        media_type = declared if isinstance(declared, str) and declared else header
        if media_type not in MANIFEST_TYPES or header not in {"", media_type}:
            types = f"{_one_line(str(declared or ''))} (body), {_one_line(header)} (Content-Type)"
            raise RegistryError(f"{answered} of media type {types}: refused; only Docker "
                                "schema 2 and OCI images and indexes are read")  # fmt: skip
        problem = _shape_problem(document, media_type in INDEX_TYPES)
        if problem:
            raise RegistryError(f"{answered} whose {problem}: refused")
        return Manifest(media_type, body, digest)

    # --- transport and auth ----------------------------------------------------------------

    def _send(
        self, method: str, name: str, path: str, actions: str, *, url: str = "", **kwargs: Any
    ) -> requests.Response:
        """One request to /v2/<name>/<path>, or to url (an upload's location), its redirects
        followed (module docstring). The credentials go to this registry only: a location on
        another host is sent none."""
        url = url or f"{self.base_url}/v2/{name}/{path}"
        headers = {"Accept": MANIFEST_ACCEPT, "Accept-Encoding": "identity",
                   **kwargs.pop("headers", {})}  # fmt: skip
        key = f"{name}:{actions}"
        ours = self._ours(url)
        response = self._request(method, url, headers=self._with_auth(headers, key, ours),
                                 **kwargs)  # fmt: skip
        if response.status_code == _UNAUTHORIZED and ours:
            response.close()
            self._auth[key] = self._authorize(response, name, actions)
            response = self._request(method, url, headers=self._with_auth(headers, key), **kwargs)
        for _ in range(MAX_REDIRECTS):
            if not response.is_redirect or method not in {"GET", "HEAD"}:
                return response
            response.close()
            target = urllib.parse.urljoin(url, response.headers["Location"])
            if urllib.parse.urlsplit(target).scheme != "https" and not self._ours(target):
                raise RegistryError(f"the registry {self.host} redirected {method} {name}/{path} "
                                    f"to {_one_line(target)}: only https redirects are "
                                    "followed; check the registry")  # fmt: skip
            url = target
            response = self._request(method, url, headers=self._with_auth(headers, key,
                                                                          self._ours(url)),
                                     **kwargs)  # fmt: skip
        response.close()
        raise RegistryError(f"the registry {self.host} redirected {method} {name}/{path} more "
                            f"than {MAX_REDIRECTS} times: check the registry")  # fmt: skip

    @property
    def _hostname(self) -> str | None:
        return urllib.parse.urlsplit(self.base_url).hostname

    def _ours(self, url: str) -> bool:
        return urllib.parse.urlsplit(url).netloc == urllib.parse.urlsplit(self.base_url).netloc

    def _with_auth(self, headers: dict[str, str], key: str, ours: bool = True) -> dict[str, str]:
        if ours and key in self._auth:
            return {**headers, "Authorization": self._auth[key]}
        return headers

    def _request(
        self, method: str, url: str, *, session: requests.Session | None = None, **kwargs: Any
    ) -> requests.Response:
        body = kwargs.get("data")
        # Streamed, so that every body is read bounded (_body); redirects are _send's to follow.
        kwargs = {"stream": True, "allow_redirects": False, **kwargs}
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
        self._check_realm(params["realm"])
        auth = (self.credentials.username, self.credentials.password) if self.credentials else None
        response = self._request("GET", params["realm"], params=query, auth=auth,
                                 headers={"Accept-Encoding": "identity"})  # fmt: skip
        realm, reason = _one_line(params["realm"]), _one_line(response.reason)
        answered = f"its token service {realm} answered {response.status_code} {reason}"
        if response.status_code in RETRIED_STATUSES or not response.ok:
            response.close()
        if response.status_code == _TOO_MANY_REQUESTS:
            raise _rate_limited(f"the registry {self.host}'s token service {realm} answered 429 "
                                f"{reason}{self.budget.waited()}")  # fmt: skip
        if response.status_code >= _SERVER_ERROR:
            raise RegistryError(f"the registry {self.host} could not authorize: {answered}"
                                f"{self.budget.waited()}; the registry is in trouble, retry "
                                "later")  # fmt: skip
        if not response.ok:
            raise self._denied(answered)
        body = self._body(response, MAX_ANSWER_BYTES, f"a token from {realm}")
        try:
            document = json.loads(body)
            token = document.get("token") or document.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise self._denied(f"its token service {realm} returned no token")
        return f"Bearer {token}"

    def _check_realm(self, realm: str) -> None:
        """A token realm fit for this registry's credentials (module docstring)."""
        parts = urllib.parse.urlsplit(realm)
        loopback = plain_http(self.host) and plain_http(parts.netloc)
        if parts.scheme != "https" and not (parts.scheme == "http" and loopback):
            why = "it is not https"
        elif self.credentials and parts.hostname not in {self._hostname, *self.token_hosts}:
            why = "credentials go only to the registry's own host or one REGISTRY_TOKEN_HOSTS names"
        else:
            return
        raise RegistryError(f"the registry {self.host} named a token service, and this client "
                            f"refused the token realm {_one_line(realm)}: {why}; if it is the "
                            "registry's own token service, add its host to "
                            "REGISTRY_TOKEN_HOSTS")  # fmt: skip

    def _denied(self, why: str) -> RegistryError:
        return RegistryError(
            f"the registry {self.host} refused access: {why}; set REGISTRY_USERNAME and "
            "REGISTRY_PASSWORD (for ghcr.io: GITHUB_TOKEN with packages: write) or docker login"
        )

    def _check(self, response: requests.Response, method: str, name: str, ref: str) -> None:
        if response.ok:
            return
        try:  # read, which also closes it
            detail = _error_detail(self._body(response, MAX_ANSWER_BYTES, "an error"))
        except RegistryError:
            detail = ""  # the status says enough
        if response.status_code == _UNAUTHORIZED:
            raise self._denied(f"{method} {name}:{ref} is still 401 with the credentials given")
        reason = _one_line(response.reason)  # the status line's: the registry's words
        if response.status_code == _TOO_MANY_REQUESTS:
            raise _rate_limited(f"the registry {self.host} answered {method} {name}:{ref} with "
                                f"429 {reason}{self.budget.waited()}")  # fmt: skip
        raise RegistryError(
            f"the registry {self.host} answered {method} {name}:{ref} with "
            f"{response.status_code} {reason}{detail}: check the registry and the "
            "credentials' permissions"
        )


def checked_digest(digest: str) -> str:
    """digest, if it is a SHA-256 digest (the only kind this client can check), before it
    becomes part of a URL."""
    if not DIGEST.fullmatch(digest):
        raise RegistryError(f"{_one_line(digest)!r} is not a sha256:<64 hex> digest: only "
                            "SHA-256 blobs and manifests are fetched or uploaded")  # fmt: skip
    return digest


def _reference(reference: str) -> str:
    """reference, if it is a tag or a digest (the OCI grammar's), before it becomes a path."""
    if not (TAG.fullmatch(reference) or DIGEST.fullmatch(reference)):
        raise RegistryError(f"{_one_line(reference)!r} is not a tag nor a sha256:<64 hex> "
                            "digest: refused before any request")  # fmt: skip
    return reference


def _digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _shape_problem(document: dict[str, Any], index: bool) -> str:
    """What in a manifest is not the JSON objects a reader takes it for; "" if nothing."""
    if not index and not isinstance(document.get("config"), dict):
        return "config is not a JSON object"
    key = "manifests" if index else "layers"
    listed = document.get(key)
    if not isinstance(listed, list) or not all(isinstance(entry, dict) for entry in listed):
        return f"{key} is not a list of JSON objects"
    return ""


def _rate_limited(what: str) -> RegistryError:
    return RegistryError(f"{what}: rate-limited by the registry (HTTP 429), retry later")


def _retry_after(response: requests.Response, backoff: float) -> float:
    """Seconds to wait before the next attempt: Retry-After when the answer has one."""
    seconds = retry_after(response.headers.get("Retry-After", ""))
    return backoff if seconds is None else seconds


def _error_detail(body: bytes) -> str:
    """The first error of an OCI error body, as ``(CODE: message)``."""
    try:
        errors = json.loads(body).get("errors", [])
        first = errors[0]
        detail = _one_line(f"{first.get('code')}: {first.get('message')}")
    except (ValueError, AttributeError, IndexError, TypeError):
        return ""
    return f" ({detail})"
