"""The Kubernetes API, spoken directly: the pod's service account token and CA, JSON over HTTPS.

What the gate relies on, and the fake API server of the tests enforces:

* reads are GETs, lists paged with ``limit`` and ``continue``, bounded in pages, items per page
  and bytes (:data:`MAX_PAGES`, :data:`PAGE_SIZE`, :data:`ANSWER_BYTES`, :data:`LIST_BYTES`),
  JSON in depth (:mod:`~nvidia_driver.formats.jsontext`);
* writes are JSON merge patches (RFC 7386, ``application/merge-patch+json``) that carry the
  ``metadata.resourceVersion`` the decision was made on: the server answers 409 Conflict when the
  object changed since, and the caller reads it again and decides again (:class:`ConflictError`);
* 429 and 5xx answers, and exchanges that fail, are retried a bounded number of times.

The token is read from its file at every request: the kubelet rotates projected tokens. The
API server is asked directly, never through the environment's proxy: it is never behind the
node's forward proxy, whether or not ``no_proxy`` lists the service network.
"""

from __future__ import annotations

import json
import re
import ssl
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from pathlib import Path
from typing import Any

from nvidia_driver.errors import DriverError
from nvidia_driver.formats import jsontext
from nvidia_driver.limits import MiB
from nvidia_driver.safetext import ANNOTATION_SHOWN, check_name, shown
from nvidia_driver.settings import (
    KUBERNETES_SERVICE_HOST,
    KUBERNETES_SERVICE_PORT,
    REBOOT_GATE_API_SERVER,
)
from nvidia_driver.sources.download import Backoff
from nvidia_driver.sources.http import (
    OK,
    Client,
    Limits,
    Response,
    UnreachableError,
    send_retried,
)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# The API server's URL: a ``kubectl proxy`` on 127.0.0.1 to run the gate outside the cluster.
MERGE_PATCH = "application/merge-patch+json"
PAGE_SIZE = 100
MAX_PAGES = 500  # 50,000 objects
# One answer: an object is at most 1.5 MiB (etcd's request limit), a page of 100 nodes a few MiB.
# The bound is on parsed memory too: 4 MiB of "{}," is 1.4 million dicts, ~100 MiB in Python.
ANSWER_BYTES = 4 * MiB
LIST_BYTES = 64 * MiB  # every page of one list together: about 2,000 nodes
_TOKEN_LIMIT = 64 * 1024
_LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
# What the API server accepts as the name of a node, a pod or a secret (apimachinery's
# IsDNS1123Subdomain) and of a namespace (IsDNS1123Label). A name is a segment of a request's
# path: a name outside these ("..", "a/b", "a?b") would make the request another one.
_DNS1123_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
OBJECT_NAME = re.compile(rf"(?=.{{1,253}}\Z){_DNS1123_LABEL}(?:\.{_DNS1123_LABEL})*")
NAMESPACE = re.compile(rf"(?=.{{1,63}}\Z){_DNS1123_LABEL}")


def object_name(text: str, what: str, fix: str) -> str:
    """``text``, when it can name a node, a pod or a secret in a request's path."""
    return check_name(text, OBJECT_NAME, what, "a Kubernetes object name (lower-case letters, "
                      "digits, '-' and '.', at most 253)", fix)  # fmt: skip


def namespace(text: str, what: str, fix: str) -> str:
    """``text``, when it can name a namespace in a request's path."""
    return check_name(text, NAMESPACE, what, "a Kubernetes namespace (lower-case letters, digits "
                      "and '-', at most 63)", fix)  # fmt: skip


class ConflictError(DriverError):
    """409: the object changed since it was read (or already exists)."""


class NotFoundError(DriverError):
    """404: no such object."""


@dataclass
class KubeAPI:
    base_url: str  # scheme://host:port
    token_file: Path | None = None
    client: Client = field(default_factory=Client)
    backoff: Backoff = field(default_factory=lambda: Backoff(attempts=4, first_delay=1.0))
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        self.client = replace(self.client, proxy=False)  # whatever client: direct (see above)
        parts = urllib.parse.urlsplit(self.base_url)
        url = shown(self.base_url, ANNOTATION_SHOWN)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise DriverError(
                f"invalid Kubernetes API server URL '{url}': give https://host:port (or "
                f"http://127.0.0.1:port for kubectl proxy) in {REBOOT_GATE_API_SERVER}"
            )
        if parts.scheme == "http" and parts.hostname not in _LOOPBACK:
            host = shown(parts.hostname, ANNOTATION_SHOWN)
            raise DriverError(
                f"refusing plain http to the Kubernetes API at {host}: the service account token "
                "would cross the network in clear; use https, or kubectl proxy on 127.0.0.1"
            )
        self.base_url = self.base_url.rstrip("/")

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        service_account: Path = SERVICE_ACCOUNT_DIR,
        limits: Limits | None = None,
    ) -> KubeAPI:
        """In the cluster: KUBERNETES_SERVICE_HOST/PORT with the pod's token and CA."""
        url = env.get(REBOOT_GATE_API_SERVER, "").strip()
        if not url:
            host = env.get(KUBERNETES_SERVICE_HOST, "").strip()
            port = env.get(KUBERNETES_SERVICE_PORT, "").strip() or "443"
            if not host:
                raise DriverError(
                    "not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST): run the gate as the "
                    f"DaemonSet of deploy/reboot-gate, or set {REBOOT_GATE_API_SERVER}"
                )
            url = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        context = None
        ca = service_account / "ca.crt"
        if url.startswith("https://") and ca.is_file():
            context = ssl.create_default_context(cafile=str(ca))
        token = service_account / "token"
        return cls(
            url,
            token_file=token if token.is_file() else None,
            client=Client(limits or Limits(max_bytes=ANSWER_BYTES), context),
        )

    # --- the verbs the gate uses -----------------------------------------------------------

    def get(self, path: str, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        return _document(self._answer("GET", path, query), "GET", path)

    def list(self, path: str, label_selector: str = "") -> list[dict[str, Any]]:
        """Every item of a list, page by page."""
        items: list[dict[str, Any]] = []
        query = {"limit": str(PAGE_SIZE)}
        if label_selector:
            query["labelSelector"] = label_selector
        size = 0
        for _ in range(MAX_PAGES):
            answer = self._answer("GET", path, query)
            size += len(answer.body)
            if size > LIST_BYTES:
                raise DriverError(
                    f"Kubernetes API: GET {path} answered more than {LIST_BYTES} bytes in all, "
                    "the gate's bound for one list"
                )
            page = _document(answer, "GET", path)
            found = page.get("items")
            if not isinstance(found, list):
                raise DriverError(f"Kubernetes API: GET {path} answered no list of items")
            if len(found) > PAGE_SIZE:
                raise DriverError(
                    f"Kubernetes API: GET {path} answered {len(found)} items for a page of "
                    f"at most {PAGE_SIZE}"
                )
            items += [item for item in found if isinstance(item, dict)]
            metadata = page.get("metadata")
            token = metadata.get("continue") if isinstance(metadata, dict) else None
            if not token:
                return items
            query["continue"] = str(token)
        raise DriverError(f"Kubernetes API: GET {path} has more than {MAX_PAGES} pages")

    def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Apply an RFC 7386 merge patch; :class:`ConflictError` if its resourceVersion is stale."""
        answer = self._answer("PATCH", path, body=patch, content_type=MERGE_PATCH)
        return _document(answer, "PATCH", path)

    def create(self, path: str, document: Mapping[str, Any]) -> dict[str, Any]:
        answer = self._answer("POST", path, body=document, content_type="application/json")
        return _document(answer, "POST", path)

    def delete(self, path: str) -> None:
        """Delete the object; :class:`NotFoundError` if it is gone already."""
        self._answer("DELETE", path)

    # --- one exchange, retried -------------------------------------------------------------

    def _answer(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str = "",
    ) -> Response:
        """The successful answer, within :data:`ANSWER_BYTES` whatever the client's limits."""
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        payload = None if body is None else json.dumps(body).encode()

        def send() -> Response:
            headers = {"Accept": "application/json", **self._authorization()}
            if content_type:
                headers["Content-Type"] = content_type
            return self.client.send(method, url, headers, payload)

        try:
            response = send_retried(send, self.backoff, self.sleep)
        except UnreachableError as exc:
            raise DriverError(f"Kubernetes API: {exc}; check the cluster's network") from None
        if response.status not in OK:
            raise _failure(response, method, path)
        if len(response.body) > ANSWER_BYTES:
            raise DriverError(
                f"Kubernetes API: {method} {path} answered {len(response.body)} bytes, over the "
                f"limit of {ANSWER_BYTES}: not what the gate asked for"
            )
        return response

    def _authorization(self) -> dict[str, str]:
        if self.token_file is None:
            return {}
        try:
            with self.token_file.open("rb") as file:
                token = file.read(_TOKEN_LIMIT).decode("ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = shown(str(exc), ANNOTATION_SHOWN)
            raise DriverError(
                f"cannot read the service account token {self.token_file}: {why}; check that the "
                "pod mounts its service account (automountServiceAccountToken)"
            ) from None
        return {"Authorization": f"Bearer {token}"} if token else {}


def _document(response: Response, method: str, path: str) -> dict[str, Any]:
    what = f"Kubernetes API: the answer to {method} {path}"
    document = jsontext.parse(response.body or b"{}", what)
    if not isinstance(document, dict):
        raise DriverError(f"Kubernetes API: {method} {path} answered no JSON object")
    return document


def _failure(response: Response, method: str, path: str) -> DriverError:
    message = ""
    try:
        status = jsontext.parse(response.body, "the failure's Status")
        message = str(status.get("message", "")) if isinstance(status, dict) else ""
    except DriverError:
        pass  # the status line says enough
    line = f"Kubernetes API: {method} {path} answered {response.status}"
    if message:
        line += f": {shown(message)}"
    if response.status == HTTPStatus.CONFLICT:
        return ConflictError(line)
    if response.status == HTTPStatus.NOT_FOUND:
        return NotFoundError(line)
    if response.status in {HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN}:
        return DriverError(
            f"{line}; check the gate's service account and RBAC (deploy/reboot-gate)"
        )
    return DriverError(line)
