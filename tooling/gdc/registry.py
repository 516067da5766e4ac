"""A small OCI distribution API client: which tags exist, tag copies, and blobs, down and up
(:mod:`gdc.compression` rewrites layers with them).

Registries on 127.0.0.1 or localhost are spoken to over plain http, all others over https.
Answers 429 and 5xx are retried, a bounded number of times with exponential backoff, honouring
``Retry-After`` (seconds or an HTTP date) up to :data:`MAX_RETRY_AFTER_SECONDS`, and only while
the client's :class:`RetryBudget` lasts (``invoke publish`` gives its whole run one): past it
the answer stands, and a 429, the registry's or its token service's, is reported as a rate
limit, never as a credentials problem.

It speaks through the HTTP client the reboot gate uses too (:mod:`nvidia_driver.sources.http`:
one deadline per request, the environment's proxy). Every answer is read as sent
(``Accept-Encoding: identity``) and within a byte bound, then checked as the reboot gate
checks it, by :mod:`nvidia_driver.formats.oci` (its docstring says what: digests, media types
and shapes, references, redirects, token realms). Failures are DriverErrors.

On a 401 the client follows the ``WWW-Authenticate`` challenge: for ``Bearer`` (ghcr.io, Docker
Hub, registry:2 with token auth) it asks the realm for a token for the challenge's service and
scope, for ``Basic`` it sends the credentials. Credentials, first found wins:

1. ``REGISTRY_USERNAME`` and ``REGISTRY_PASSWORD``;
2. the registry's entry in the docker config (``$DOCKER_CONFIG/config.json`` or
   ``~/.docker/config.json``, as ``docker login`` writes it without a credential helper), read
   as the reboot gate reads a pull secret (``nvidia_driver.formats.oci``);
3. for ghcr.io, ``GITHUB_TOKEN`` (user ``$GITHUB_ACTOR``);
4. none: anonymous tokens, enough to read public images.

Blobs move through a client of their own, whose deadline (:data:`BLOB_DEADLINE_SECONDS`) fits a
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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from gdc.text import first_line
from nvidia_driver.errors import DriverError
from nvidia_driver.formats.oci import (
    ACCEPT,
    MAX_ANSWER_BYTES,
    MAX_CONFIG_BYTES,
    MAX_MANIFEST_BYTES,
    MAX_REDIRECTS,
    REDIRECTS,
    Credentials,
    Manifest,
    api_host,
    base_url,
    check_identity,
    check_realm,
    checked_digest,
    checked_reference,
    config_digest,
    credentials_from_docker_config,
    error_detail,
    index_platforms,
    joined,
    on_registry,
    parse_challenge,
    read_config,
    read_manifest,
    redirect_target,
    retry_after,
    token_of,
    token_url,
)
from nvidia_driver.safetext import shown
from nvidia_driver.sources.http import Answer, Client, Limits, UnreachableError

USER_AGENT = "gpu-driver-container-tooling"
DEADLINE_SECONDS = 120.0  # one request: a manifest, a config blob, a token
TIMEOUT_SECONDS = 60.0  # one read or write
RETRIES = 4  # after the first attempt: 1 + 2 + 4 + 8 s of backoff at most, Retry-After aside
BACKOFF_SECONDS = 1.0
MAX_RETRY_AFTER_SECONDS = 60.0
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
BLOB_DEADLINE_SECONDS = 3600.0  # one blob, down or up: a precompiled image's layer is ~1 GB
CHUNK_BYTES = 1 << 20
_HOST = re.compile(r"[^/]*[.:][^/]*|localhost")
_NOT_FOUND = 404
_BAD_REQUEST = 400  # an answer from here up failed
_UNAUTHORIZED = 401
_TOO_MANY_REQUESTS = 429
_SERVER_ERROR = 500


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
            raise DriverError(
                f"{repository!r} names no registry host: pass --registry with one, "
                "e.g. ghcr.io/<owner> or 127.0.0.1:5000/gdc"
            )
        return cls(host, name)

    def __str__(self) -> str:
        return f"{self.host}/{self.name}"


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


def full_disk(error: BaseException | None, path: Path) -> DriverError | None:
    """The one line for a write to path that failed for want of space, else None."""
    if not isinstance(error, OSError) or error.errno not in {errno.ENOSPC, errno.EDQUOT}:
        return None
    return DriverError(f"no space left on the disk of {path} ({_first_line(error)}): free "
                       "space there, or set TMPDIR to a larger disk")  # fmt: skip


def _one_line(text: str) -> str:
    """A registry's words on one line: blanks collapsed, every other control character escaped
    (nvidia_driver.safetext), 200 characters at most."""
    return shown(" ".join(text.split()))


def _first_line(error: Exception) -> str:
    return _one_line(first_line(error))


def _client(deadline: float) -> Client:
    return Client(Limits(TIMEOUT_SECONDS, deadline), user_agent=USER_AGENT)


class Registry:
    """One registry host; ``client`` is injectable (tests give it shorter limits)."""

    def __init__(
        self,
        host: str,
        *,
        credentials: Credentials | None = None,
        client: Client | None = None,
        retries: int = RETRIES,
        sleep: Callable[[float], None] = time.sleep,
        retry_budget: float = math.inf,
        token_hosts: frozenset[str] = frozenset(),
    ) -> None:
        self.host = host  # as the user named it: credentials and messages
        self.api_host = api_host(host)  # where requests, and so credentials, go
        self.token_hosts = token_hosts
        self.base_url = base_url(self.api_host)
        self.credentials = credentials
        self.client = client or _client(DEADLINE_SECONDS)  # each request within one deadline
        # Blobs: a longer deadline, the same client when one is given (tests).
        self.blob_client = client or _client(BLOB_DEADLINE_SECONDS)
        self.retries = retries
        self.sleep = sleep
        self.budget = RetryBudget(retry_budget)  # the caller may replace it (per image)
        self.requests = 0  # sent, retries included: what a run cost
        self.retried = 0
        self._auth: dict[str, str] = {}  # "<name>:<actions>" -> Authorization header

    # --- the API ---------------------------------------------------------------------------

    def digest(self, name: str, reference: str) -> str | None:
        """The manifest digest of name:reference (its bytes'), or None when there is no such tag."""
        found = self._manifest_of(name, reference, missing_ok=True)
        return found.digest if found else None

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
        digest = config_digest(manifest, f"the config blob of {self.host}/{name}")
        answer = self._send("GET", name, f"blobs/{digest}", "pull")
        self._check(answer, "GET", name, digest)
        body = self._body(answer, MAX_CONFIG_BYTES, f"the config blob {digest} of {name}")
        what = f"the registry {self.host}'s config blob {digest} of {name}"
        return read_config(body, digest, what)

    def platforms(self, name: str, reference: str) -> frozenset[str]:
        """``os/arch`` of each image behind name:reference (attestation entries left out)."""
        manifest = self.manifest(name, reference)
        if manifest.is_index:
            found = index_platforms(manifest)
            return frozenset(f"{os}/{arch}" for os, arch in found if os != "unknown")
        config = self.config(name, manifest)
        return frozenset({f"{config.get('os')}/{config.get('architecture')}"})

    def put_manifest(self, name: str, tag: str, manifest: Manifest) -> str:
        """Tag manifest as name:tag (a copy within the repository: no blob moves)."""
        checked_reference(tag, f"{self.host}/{name}")
        with self._send("PUT", name, f"manifests/{tag}", "pull,push", body=manifest.body,
                        headers={"Content-Type": manifest.media_type}) as answer:  # fmt: skip
            self._check(answer, "PUT", name, tag)
        return answer.header("Docker-Content-Digest") or manifest.digest

    def blob_exists(self, name: str, digest: str) -> bool:
        """Whether the registry has blob digest in name (a HEAD)."""
        checked_digest(digest, f"a blob of {self.host}/{name}")
        with self._send("HEAD", name, f"blobs/{digest}", "pull") as answer:
            if answer.status == _NOT_FOUND:
                return False
            self._check(answer, "HEAD", name, digest)
        return True

    def fetch_blob(self, name: str, digest: str, size: int, destination: Path) -> None:
        """Write blob digest of name to destination: at most size bytes, streamed, its size and
        SHA-256 checked before this returns (a mismatch leaves no file)."""
        checked_digest(digest, f"a blob of {self.host}/{name}")
        with self._send("GET", name, f"blobs/{digest}", "pull", blobs=True) as answer:
            self._check(answer, "GET", name, digest)
            hasher, count = hashlib.sha256(), 0
            try:
                with self._reading(f"blob {digest} of {name}"), destination.open("wb") as out:
                    for chunk in iter(lambda: answer.read(CHUNK_BYTES), b""):
                        count += len(chunk)
                        if count > size:
                            break
                        hasher.update(chunk)
                        out.write(chunk)
            except DriverError as broke:
                destination.unlink(missing_ok=True)
                raise full_disk(broke.__cause__, destination) or broke from None
        found = "sha256:" + hasher.hexdigest()
        if count != size or found != digest:
            destination.unlink(missing_ok=True)
            got = f"more than {size} bytes" if count > size else f"{count} bytes, {found}"
            raise DriverError(f"the registry {self.host} sent {got} for blob {digest} of "
                              f"{name} ({size} bytes): refused, nothing read from it; the "
                              "registry's copy is damaged or not what its manifest "
                              "names")  # fmt: skip

    def upload_blob(self, name: str, path: Path, digest: str) -> None:
        """Upload the file path as blob digest of name: POST for a location, then one PUT."""
        checked_digest(digest, f"a blob of {self.host}/{name}")
        with self._send("POST", name, "blobs/uploads/", "pull,push",
                        headers={"Content-Length": "0"}) as started:  # fmt: skip
            self._check(started, "POST", name, "blobs/uploads/")
        location = started.header("Location")
        if not location:
            raise DriverError(f"the registry {self.host} started an upload to {name} but gave "
                              "no Location: check the registry")  # fmt: skip
        sent = f"the registry {self.host} started an upload to {name} and sent it"
        url = joined(f"{self.base_url}/v2/{name}/blobs/uploads/", location, sent)
        url += f"{'&' if urllib.parse.urlsplit(url).query else '?'}digest={digest}"
        with (
            path.open("rb") as body,
            self._send("PUT", name, "", "pull,push", url=url, body=body, blobs=True,
                       headers={"Content-Type": "application/octet-stream",
                                "Content-Length": str(path.stat().st_size)}) as answer,
        ):  # fmt: skip
            self._check(answer, "PUT", name, digest)

    # --- reading an answer -----------------------------------------------------------------

    def _manifest_of(self, name: str, reference: str, *, missing_ok: bool) -> Manifest | None:
        checked_reference(reference, f"{self.host}/{name}")
        answer = self._send("GET", name, f"manifests/{reference}", "pull")
        if answer.status == _NOT_FOUND and missing_ok:
            answer.close()
            return None
        self._check(answer, "GET", name, reference)
        what = f"{name}{'@' if reference.startswith('sha256:') else ':'}{reference}"
        body = self._body(answer, MAX_MANIFEST_BYTES, f"the manifest {what}")
        return read_manifest(body, content_type=answer.header("Content-Type"),
                             claimed=answer.header("Docker-Content-Digest"),
                             reference=reference, what=f"the registry {self.host} answered GET "
                             f"{what}: the manifest")  # fmt: skip

    def _body(self, answer: Answer, limit: int, what: str) -> bytes:
        """answer's body as sent, at most limit bytes; the answer is closed."""
        with answer, self._reading(what):
            check_identity(answer.header("Content-Encoding"),
                           f"the registry {self.host} sent {what}")  # fmt: skip
            return answer.read_all(limit)

    @contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        """A transfer (or a write of it) that breaks off as one DriverError; its cause kept."""
        try:
            yield
        except (UnreachableError, OSError) as exc:
            raise DriverError(f"the registry {self.host} broke off {what} ({_first_line(exc)}): "
                              "retry") from exc  # fmt: skip

    # --- transport and auth ----------------------------------------------------------------

    def _send(self, method: str, name: str, path: str, actions: str, *, url: str = "",
              headers: Mapping[str, str] | None = None, body: bytes | BinaryIO | None = None,
              blobs: bool = False) -> Answer:  # fmt: skip
        """One request to /v2/<name>/<path>, or to url (an upload's location), its redirects
        followed (module docstring); the caller closes the answer. The credentials go to this
        registry only: a location on another host is sent none."""
        url = url or f"{self.base_url}/v2/{name}/{path}"
        sent = {"Accept": ACCEPT, "Accept-Encoding": "identity", **(headers or {})}
        key = f"{name}:{actions}"
        ours = on_registry(url, self.api_host)
        answer = self._request(method, url, self._with_auth(sent, key, ours), body, blobs)
        if answer.status == _UNAUTHORIZED and ours:
            self._auth[key] = self._authorize(answer, name, actions)
            answer = self._request(method, url, self._with_auth(sent, key), body, blobs)
        for _ in range(MAX_REDIRECTS):
            if answer.status not in REDIRECTS or method not in {"GET", "HEAD"}:
                return answer
            answer.close()
            url = redirect_target(url, answer.header("Location"), self.api_host,
                                  f"the registry {self.host} redirected {method} "
                                  f"{name}/{path}")  # fmt: skip
            answer = self._request(method, url, self._with_auth(
                sent, key, on_registry(url, self.api_host)), body, blobs)  # fmt: skip
        answer.close()
        raise DriverError(f"the registry {self.host} redirected {method} {name}/{path} more "
                          f"than {MAX_REDIRECTS} times: check the registry")  # fmt: skip

    def _with_auth(self, headers: dict[str, str], key: str, ours: bool = True) -> dict[str, str]:
        if ours and key in self._auth:
            return {**headers, "Authorization": self._auth[key]}
        return headers

    def _request(self, method: str, url: str, headers: Mapping[str, str],
                 body: bytes | BinaryIO | None = None, blobs: bool = False) -> Answer:  # fmt: skip
        """The answer, 429 and 5xx retried within the budget; a DriverError if there is none."""
        for attempt in range(self.retries + 1):
            self.requests += 1
            if isinstance(body, io.IOBase):  # a file sent again is sent from its start
                body.seek(0)
            try:
                answer = (self.blob_client if blobs else self.client).open(
                    method, url, headers, body
                )
            except UnreachableError as exc:
                raise DriverError(
                    f"cannot reach the registry {self.host} ({_first_line(exc)}): check "
                    "--registry and that the registry is up"
                ) from None
            if answer.status not in RETRIED_STATUSES or attempt == self.retries:
                return answer
            wait = _retry_after(answer, BACKOFF_SECONDS * 2**attempt)
            if wait > MAX_RETRY_AFTER_SECONDS or not self.budget.spend(wait):
                return answer  # the caller says what the registry answered
            answer.close()  # an answer holds its connection until closed
            self.retried += 1
            self.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    def _authorize(self, challenge: Answer, name: str, actions: str) -> str:
        challenge.close()
        header = challenge.header("WWW-Authenticate")
        scheme, params = parse_challenge(header)
        if scheme == "basic" and self.credentials:
            return self.credentials.basic
        if scheme != "bearer" or "realm" not in params:
            raise self._denied(f"it asks for {header or 'authentication'!r}")
        check_realm(params["realm"], self.api_host, credentials=self.credentials is not None,
                    trusted=self.token_hosts, what=f"the registry {self.host}")  # fmt: skip
        headers = {"Accept-Encoding": "identity"}
        if self.credentials:
            headers["Authorization"] = self.credentials.basic
        answer = self._request("GET", token_url(params, f"repository:{name}:{actions}"), headers)
        realm, reason = _one_line(params["realm"]), _one_line(answer.reason)
        answered = f"its token service {realm} answered {answer.status} {reason}"
        if answer.status >= _BAD_REQUEST:
            answer.close()
        if answer.status == _TOO_MANY_REQUESTS:
            raise _rate_limited(f"the registry {self.host}'s token service {realm} answered 429 "
                                f"{reason}{self.budget.waited()}")  # fmt: skip
        if answer.status >= _SERVER_ERROR:
            raise DriverError(f"the registry {self.host} could not authorize: {answered}"
                              f"{self.budget.waited()}; the registry is in trouble, retry "
                              "later")  # fmt: skip
        if answer.status >= _BAD_REQUEST:
            raise self._denied(answered)
        body = self._body(answer, MAX_ANSWER_BYTES, f"a token from {realm}")
        token, _ = token_of(body, f"the registry {self.host}'s token service {realm}")
        return f"Bearer {token}"

    def _denied(self, why: str) -> DriverError:
        return DriverError(
            f"the registry {self.host} refused access: {why}; set REGISTRY_USERNAME and "
            "REGISTRY_PASSWORD (for ghcr.io: GITHUB_TOKEN with packages: write) or docker login"
        )

    def _check(self, answer: Answer, method: str, name: str, ref: str) -> None:
        if answer.status < _BAD_REQUEST:
            return
        try:  # read, which also closes it
            detail = error_detail(self._body(answer, MAX_ANSWER_BYTES, "an error"))
        except DriverError:
            detail = ""  # the status says enough
        if answer.status == _UNAUTHORIZED:
            raise self._denied(f"{method} {name}:{ref} is still 401 with the credentials given")
        reason = _one_line(answer.reason)  # the status line's: the registry's words
        if answer.status == _TOO_MANY_REQUESTS:
            raise _rate_limited(f"the registry {self.host} answered {method} {name}:{ref} with "
                                f"429 {reason}{self.budget.waited()}")  # fmt: skip
        raise DriverError(
            f"the registry {self.host} answered {method} {name}:{ref} with "
            f"{answer.status} {reason}{detail}: check the registry and the "
            "credentials' permissions"
        )


def _rate_limited(what: str) -> DriverError:
    return DriverError(f"{what}: rate-limited by the registry (HTTP 429), retry later")


def _retry_after(answer: Answer, backoff: float) -> float:
    """Seconds to wait before the next attempt: Retry-After when the answer has one."""
    seconds = retry_after(answer.header("Retry-After"))
    return backoff if seconds is None else seconds
