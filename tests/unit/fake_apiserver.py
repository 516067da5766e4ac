"""A stand-in Kubernetes API server on 127.0.0.1: only for fault injection in the gate's tests.

It exists for what a real API server cannot be made to do on demand: answer a chosen request
with a 5xx, a 429, a 401 or 403, a 404 or a 409 (``faults``: a CRD that is not installed while
the others are, a refused Event, a server failing mid-step), and serve hostile bodies (``raw``:
a body nested 1,000 deep, a 16 MiB page, fields of the wrong type). Around the faults it holds
the objects a test puts, so that the gate gets as far as the fault: GET, a list filtered by
``k=v`` label selectors (one page), POST, DELETE, and PATCH as a JSON merge patch (RFC 7386).

It implements none of the API server's semantics: no authentication or RBAC, no validation,
no resourceVersion check, no paging, no CRDs. The gate's decisions and every semantic flow run
against the real peers in tests/integration/cluster: the real kube-apiserver with
deploy/reboot-gate's RBAC, its admission, Event validation, 409s, 404s and pages (decisions/,
test_reboot_gate.py), FLUO's update-operator and update-agent (test_fluo_flow.py,
test_fluo_without_gpus.py), kured (test_kured_flow.py) and the GPU Operator
(test_operator_renders.py).
"""

from __future__ import annotations

import copy
import http
import json
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from local_server import LocalServer

METHODS = ("GET", "PATCH", "POST", "DELETE")


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


def _selected(selector: str, labels: dict[str, str]) -> bool:
    """``k=v`` terms, ANDed by commas: the only selectors the gate sends."""
    terms = (term.split("=", 1) for term in selector.split(",") if term)
    return all(labels.get(key) == value for key, value in terms)


def _split(path: str) -> tuple[str, str]:
    """/api/v1/nodes/gpu-1 -> ("/api/v1/nodes", "gpu-1"); a collection's name is ""."""
    parts = path.strip("/").split("/")
    collection_depth = 3 if parts[0] == "api" else 4  # /api/v1/<r>, /apis/<g>/<v>/<r>
    if len(parts) > collection_depth and parts[collection_depth - 1] == "namespaces":
        collection_depth += 2
    if len(parts) == collection_depth:
        return path.rstrip("/"), ""
    return "/" + "/".join(parts[:collection_depth]), parts[collection_depth]


@dataclass
class Fault:
    """Answer the next ``times`` requests of ``method`` ("*": any) whose path starts with
    ``path_prefix`` with ``status``."""

    method: str
    path_prefix: str
    status: int
    times: int = 1


@dataclass
class FakeAPIServer(LocalServer):
    faults: list[Fault] = field(default_factory=list)
    raw: dict[str, bytes] = field(default_factory=dict)  # path -> the body a GET answers
    objects: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    _version: int = 0

    thread_name = "apiserver"
    keep_alive = True
    methods = METHODS

    def __post_init__(self) -> None:
        super().__init__()
        self._lock = threading.RLock()

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    # --- the store, for the tests ----------------------------------------------------------

    def put(self, path: str, document: dict[str, Any]) -> dict[str, Any]:
        """Store document at path (a new resourceVersion); it is returned as stored."""
        collection, name = _split(path)
        assert name, path
        with self._lock:
            stored = self._stamp(collection, name, copy.deepcopy(document))
            self.objects.setdefault(collection, {})[name] = stored
            return copy.deepcopy(stored)

    def get(self, path: str) -> dict[str, Any]:
        collection, name = _split(path)
        with self._lock:
            return copy.deepcopy(self.objects[collection][name])

    def edit(self, path: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Change the stored object in place, as another client would: a new resourceVersion."""
        with self._lock:
            document = self.get(path)
            change(document)
            return self.put(path, document)

    def items(self, path: str) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(o) for o in self.objects.get(path.rstrip("/"), {}).values()]

    def _stamp(self, collection: str, name: str, document: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        metadata = document.setdefault("metadata", {})
        metadata["name"] = name
        metadata["resourceVersion"] = str(self._version)
        metadata.setdefault("uid", f"uid-{name}")
        parts = collection.split("/")
        if "namespaces" in parts:
            metadata["namespace"] = parts[parts.index("namespaces") + 1]
        return document

    # --- the API ---------------------------------------------------------------------------

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        method = handler.command
        url = urllib.parse.urlsplit(handler.path)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        body = handler.rfile.read(int(handler.headers.get("Content-Length", "0")))
        raw = self.raw.get(url.path) if method == "GET" else None
        if raw is not None:
            _send_bytes(handler, 200, raw)
            return
        status = self._fault(method, url.path)
        if status:
            _send(handler, status, _status(status, "injected fault"))
            return
        with self._lock:
            _send(handler, *self._operate(method, url.path, query, body))

    def _fault(self, method: str, path: str) -> int:
        with self._lock:
            for fault in self.faults:
                if fault.method in {method, "*"} and path.startswith(fault.path_prefix):
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults.remove(fault)
                    return fault.status
        return 0

    def _operate(
        self, method: str, path: str, query: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, Any]]:
        collection, name = _split(path)
        store = self.objects.setdefault(collection, {})
        if method == "GET" and not name:
            return 200, self._list(store, query)
        if method == "POST":
            document = json.loads(body)
            name = document.get("metadata", {}).get("name", "")
            store[name] = self._stamp(collection, name, document)
            return 201, copy.deepcopy(store[name])
        if name not in store:
            return 404, _status(404, f'{collection.rsplit("/", 1)[-1]} "{name}" not found')
        if method == "GET":
            return 200, copy.deepcopy(store[name])
        if method == "DELETE":
            del store[name]
            return 200, _status(200, "deleted")
        patched = merge_patch(store[name], json.loads(body))
        store[name] = self._stamp(collection, name, patched)
        return 200, copy.deepcopy(store[name])

    def _list(self, store: dict[str, dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
        selector = query.get("labelSelector", "")
        matching = [
            copy.deepcopy(document)
            for _, document in sorted(store.items())
            if _selected(selector, document.get("metadata", {}).get("labels", {}))
        ]
        metadata = {"resourceVersion": str(self._version)}
        return {"kind": "List", "metadata": metadata, "items": matching}


def _status(code: int, message: str) -> dict[str, Any]:
    reason = http.HTTPStatus(code).phrase.replace(" ", "")
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}  # fmt: skip


def _send(handler: BaseHTTPRequestHandler, status: int, document: dict[str, Any]) -> None:
    _send_bytes(handler, status, json.dumps(document).encode())


def _send_bytes(handler: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
