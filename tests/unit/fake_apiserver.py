"""A stand-in Kubernetes API server on 127.0.0.1 for the reboot gate's unit tests.

The real kube-apiserver runs in ``nox -s cluster`` (tests/integration/cluster), and the gate's
behaviour against it is tested there: its RBAC, Events about Nodes in ``default``
(``legacyValidateEvent``), the pre-pull pod under ``restricted`` Pod Security. This one is kept
for what a real server cannot be made to do on demand: answer 5xx or 429 to chosen requests,
change an object between the gate's read and its write, serve hostile bodies; and for unit tests
that run in milliseconds without root or Go.

It keeps objects in memory and enforces the semantics the gate and the reboot managers rely on,
as the real API server defines them (k8s.io/apiserver; the API conventions, "Concurrency
Control and Consistency"; RFC 7386):

* every write gives the object a new ``metadata.resourceVersion`` (one counter for all);
* PUT (an update, as FLUO's ``UpdateNodeRetry`` sends) with a stale resourceVersion, and PATCH
  whose body carries a stale ``metadata.resourceVersion``, answer 409 Conflict with a Status;
* PATCH is applied as a JSON merge patch (RFC 7386: objects merge, ``null`` deletes, anything
  else replaces) and only for ``application/merge-patch+json``; the other patch types the real
  server knows (strategic merge, JSON patch, apply) answer 415 here, unimplemented, so a client
  that sent one would fail loudly rather than pass on semantics this server lacks;
* POST creates (409 AlreadyExists for a taken name; ``generateName`` honoured), GET reads,
  and a core/v1 Event without ``eventTime`` must live in its involved object's namespace, one
  about a cluster-scoped object (no namespace) in ``default`` (422 otherwise: k8s
  ``pkg/apis/core/validation/events.go`` ``legacyValidateEvent``);
  DELETE removes; 404 NotFound with a Status for a missing object;
* lists take a label selector (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ANDed by commas)
  and page with ``limit`` and ``continue``;
* with ``users``, a request must carry one of their bearer tokens (401 otherwise), and a user
  with rules (the RBAC rules of the deploy/reboot-gate manifests) may do only what they grant
  (403): verb (get, list, create, update, patch, delete), API group, resource, resourceNames,
  and the namespace of a Role;
* a resource in ``not_installed`` (a CRD the cluster lacks) answers 404 to every request, as the
  real server answers for a path it does not serve;
* ``raw`` answers a GET of a path with the bytes given (200, JSON): what no API server would
  send (a body nested 1,000 deep, a 16 MiB page);
* ``faults`` answers the next requests that match with an injected status (a 5xx, a 429), and
  ``before_write`` runs before each write, to change an object under a client (a conflict).

Field selectors, watches, subresources and admission are not implemented.
"""

from __future__ import annotations

import copy
import json
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from local_server import LocalServer

MERGE_PATCH = "application/merge-patch+json"
OTHER_PATCHES = (
    "application/strategic-merge-patch+json",
    "application/json-patch+json",
    "application/apply-patch+yaml",
)
KINDS = {
    "nodes": "Node",
    "pods": "Pod",
    "events": "Event",
    "secrets": "Secret",
    "clusterpolicies": "ClusterPolicy",
    "nvidiadrivers": "NVIDIADriver",
    "gpuclusters": "GPUCluster",
}
VERBS = {"GET": "get", "PUT": "update", "PATCH": "patch", "POST": "create", "DELETE": "delete"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 section 2, MergePatch(Target, Patch)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (part.strip() for part in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


@dataclass(frozen=True)
class Where:
    """A request's target: /api/v1[/namespaces/<ns>]/<resource>[/<name>], or /apis/<g>/<v>/..."""

    group: str
    version: str
    namespace: str
    resource: str
    name: str

    @classmethod
    def parse(cls, path: str) -> Where | None:
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[0] == "apis" and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not 1 <= len(rest) <= 2:
            return None
        return cls(group, version, namespace, rest[0], rest[1] if len(rest) == 2 else "")

    @property
    def collection(self) -> tuple[str, str, str]:
        return self.group, self.namespace, self.resource


@dataclass
class Fault:
    method: str
    path_prefix: str
    status: int
    times: int = 1


@dataclass
class FakeAPIServer(LocalServer):
    # Bearer token -> that user's RBAC PolicyRules (with "namespace" for a Role's); None: all.
    users: dict[str, list[dict[str, Any]] | None] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    not_installed: set[str] = field(default_factory=set)  # resources (plural) without a CRD
    raw: dict[str, bytes] = field(default_factory=dict)  # path -> the body a GET answers
    before_write: Callable[[str, str], None] | None = None  # (method, path), under no lock
    log: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, content type
    objects: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = field(default_factory=dict)
    _version: int = 0

    thread_name = "apiserver"
    keep_alive = True
    methods = tuple(VERBS)

    def __post_init__(self) -> None:
        super().__init__()
        self._lock = threading.RLock()

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    # --- the store, for the tests ----------------------------------------------------------

    def put(self, path: str, document: dict[str, Any]) -> dict[str, Any]:
        """Store document at path (a new resourceVersion); it is returned as stored."""
        where = Where.parse(path)
        assert where is not None, path
        assert where.name, path
        with self._lock:
            stored = self._stamp(where, copy.deepcopy(document))
            self.objects.setdefault(where.collection, {})[where.name] = stored
            return copy.deepcopy(stored)

    def get(self, path: str) -> dict[str, Any]:
        where = Where.parse(path)
        assert where is not None
        with self._lock:
            return copy.deepcopy(self.objects[where.collection][where.name])

    def edit(self, path: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Change the stored object in place, as another client would: a new resourceVersion."""
        with self._lock:
            document = self.get(path)
            change(document)
            return self.put(path, document)

    def items(self, path: str) -> list[dict[str, Any]]:
        where = Where.parse(path)
        assert where is not None
        with self._lock:
            return [copy.deepcopy(o) for o in self.objects.get(where.collection, {}).values()]

    def _stamp(self, where: Where, document: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        metadata = document.setdefault("metadata", {})
        metadata["name"] = where.name
        metadata["resourceVersion"] = str(self._version)
        metadata.setdefault("uid", f"uid-{where.resource}-{where.name}")
        if where.namespace:
            metadata["namespace"] = where.namespace
        document.setdefault("kind", KINDS.get(where.resource, where.resource))
        return document

    # --- the API ---------------------------------------------------------------------------

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        method = handler.command
        url = urllib.parse.urlsplit(handler.path)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        body = handler.rfile.read(int(handler.headers.get("Content-Length", "0")))
        content_type = handler.headers.get("Content-Type", "")
        with self._lock:
            self.log.append((method, url.path, content_type))
            raw = self.raw.get(url.path) if method == "GET" else None
        if raw is not None:
            _send_bytes(handler, 200, raw)
            return
        status, document = self._respond(handler, method, url.path, query, body, content_type)
        _send(handler, status, document)

    def _respond(  # noqa: PLR0917 - the request's parts, as answer() has them
        self,
        handler: BaseHTTPRequestHandler,
        method: str,
        path: str,
        query: dict[str, str],
        body: bytes,
        content_type: str,
    ) -> tuple[int, dict[str, Any]]:
        fault = self._fault(method, path)
        if fault:
            return fault, _status(fault, "InternalError", "injected fault")
        token = handler.headers.get("Authorization", "").removeprefix("Bearer ")
        if self.users and token not in self.users:
            return 401, _status(401, "Unauthorized", "Unauthorized")
        where = Where.parse(path)
        if where is None or where.resource in self.not_installed:
            return 404, _status(404, "NotFound", f"the server could not find {path}")
        verb = "list" if method == "GET" and not where.name else VERBS.get(method, "")
        if not self._allowed(self.users.get(token), verb, where):
            scope = (
                f'in the namespace "{where.namespace}"'
                if where.namespace
                else "at the cluster scope"
            )
            message = (
                f'{where.resource} "{where.name}" is forbidden: User '
                f'"system:serviceaccount:test:gate" cannot {verb} resource '
                f'"{where.resource}" in API group "{where.group}" {scope}'
            )
            return 403, _status(403, "Forbidden", message)
        if method in {"PUT", "PATCH", "POST", "DELETE"} and self.before_write is not None:
            self.before_write(method, path)
        with self._lock:
            return self._operate(method, where, query, body, content_type)

    def _fault(self, method: str, path: str) -> int:
        with self._lock:
            for fault in self.faults:
                if fault.method in {method, "*"} and path.startswith(fault.path_prefix):
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults.remove(fault)
                    return fault.status
        return 0

    @staticmethod
    def _allowed(rules: list[dict[str, Any]] | None, verb: str, where: Where) -> bool:
        if rules is None:
            return True
        for rule in rules:
            if rule.get("namespace") and rule["namespace"] != where.namespace:
                continue
            names = rule.get("resourceNames")
            if (
                where.group in rule.get("apiGroups", [])
                and where.resource in rule.get("resources", [])
                and verb in rule.get("verbs", [])
                and (not names or (where.name and where.name in names))
            ):
                return True
        return False

    def _operate(  # noqa: PLR0911 - one answer per API outcome
        self, method: str, where: Where, query: dict[str, str], body: bytes, content_type: str
    ) -> tuple[int, dict[str, Any]]:
        store = self.objects.setdefault(where.collection, {})
        if method == "GET" and not where.name:
            return 200, self._list(store, query)
        if method == "POST":
            return self._create(store, where, body)
        current = store.get(where.name)
        if current is None:
            return 404, _status(404, "NotFound", f'{where.resource} "{where.name}" not found')
        if method == "GET":
            return 200, copy.deepcopy(current)
        if method == "DELETE":
            del store[where.name]
            return 200, _status(200, "", "deleted")
        document = json.loads(body)
        if method == "PATCH":
            if content_type.split(";", maxsplit=1)[0].strip() != MERGE_PATCH:
                return 415, _status(
                    415,
                    "UnsupportedMediaType",
                    f"the fake implements only {MERGE_PATCH}, not {content_type!r}",
                )
            wanted = (
                document.get("metadata", {}).get("resourceVersion")
                if isinstance(document, dict)
                else None
            )
            document = merge_patch(current, document)
        else:
            wanted = document.get("metadata", {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            message = (
                f'Operation cannot be fulfilled on {where.resource} "{where.name}": the '
                "object has been modified; please apply your changes to the latest "
                "version and try again"
            )
            return 409, _status(409, "Conflict", message)
        store[where.name] = self._stamp(where, document)
        return 200, copy.deepcopy(store[where.name])

    def _create(
        self, store: dict[str, dict[str, Any]], where: Where, body: bytes
    ) -> tuple[int, dict[str, Any]]:
        document = json.loads(body)
        invalid = _invalid_event(where, document)
        if invalid:
            return 422, _status(422, "Invalid", invalid)
        metadata = document.setdefault("metadata", {})
        name = metadata.get("name") or f"{metadata.get('generateName', '')}{self._version + 1:05x}"
        if name in store:
            return 409, _status(409, "AlreadyExists", f'{where.resource} "{name}" already exists')
        created = self._stamp(
            Where(where.group, where.version, where.namespace, where.resource, name), document
        )
        store[name] = created
        return 201, copy.deepcopy(created)

    def _list(self, store: dict[str, dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
        selector = query.get("labelSelector", "")
        matching = [
            copy.deepcopy(document)
            for _, document in sorted(store.items())
            if selector_matches(selector, document.get("metadata", {}).get("labels", {}))
        ]
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0) or len(matching) or 1
        page = matching[start : start + limit]
        metadata: dict[str, Any] = {"resourceVersion": str(self._version)}
        if start + limit < len(matching):
            metadata["continue"] = str(start + limit)
        return {"kind": "List", "apiVersion": "v1", "metadata": metadata, "items": page}


def _invalid_event(where: Where, document: dict[str, Any]) -> str:
    """legacyValidateEvent's namespace rule for an Event without eventTime; "" when it holds."""
    if (where.group, where.resource) != ("", "events") or document.get("eventTime"):
        return ""
    involved = document.get("involvedObject", {}).get("namespace", "")
    if where.namespace == (involved or "default") or (not involved and not where.namespace):
        return ""
    name = document.get("metadata", {}).get("name", "")
    return (
        f'Event "{name}" is invalid: involvedObject.namespace: Invalid value: "{involved}": '
        "does not match event.namespace"
    )


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _send(handler: BaseHTTPRequestHandler, status: int, document: dict[str, Any]) -> None:
    _send_bytes(handler, status, json.dumps(document).encode())


def _send_bytes(handler: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
