"""An OCI registry on 127.0.0.1 for the publish and sign tests: manifests, blobs, tags, uploads.

Blobs are uploaded as the distribution spec's monolithic upload has it: a POST to
``/v2/<name>/blobs/uploads/`` for a location, then a PUT of the bytes there with ``?digest=``,
refused (400 DIGEST_INVALID) when the bytes are not that digest's.

Optional ghcr.io-style token auth: a 401 with a Bearer challenge, a token endpoint that checks
basic credentials and hands out a token for the scope asked. ``status`` answers every /v2
request with that HTTP status instead (a broken registry), ``head_status`` every HEAD (one
that answers no HEAD). With ``blob_storage`` a blob GET is answered 307 to that URL
(``?digest=`` appended), as ghcr.io and Docker Hub send blobs to their storage hosts.
``spoiled`` answers the GETs and HEADs of the paths it names with the status, body and headers
it gives (a registry that lies or breaks for one image).
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import io
import json
import tarfile
import threading
import urllib.parse
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler

from local_server import LocalServer

INDEX = "application/vnd.oci.image.index.v1+json"
IMAGE = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_IMAGE = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"


def tar_layer(files: dict[str, bytes]) -> bytes:
    """A real layer: a tar of files (path -> content), as a build step would make it."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, content in sorted(files.items()):
            member = tarfile.TarInfo(path)
            member.size, member.mtime, member.mode = len(content), 1_700_000_000, 0o644
            tar.addfile(member, io.BytesIO(content))
    return data.getvalue()


def digest_of(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


@dataclass
class Stored:
    media_type: str
    body: bytes


@dataclass
class OCIRegistry(LocalServer):
    username: str = ""  # token auth when set
    password: str = ""
    status: int = 0  # answer every /v2 request with this status when set
    blob_storage: str = ""  # blob GETs are redirected (307) here when set
    head_status: int = 0  # answer every HEAD with this status when set (a registry without HEAD)
    burst: list[tuple[int, str]] = field(default_factory=list)  # (status, Retry-After) next
    spoiled: dict[str, tuple[int, bytes, dict[str, str]]] = field(default_factory=dict)  # by path
    manifests: dict[str, dict[str, Stored]] = field(default_factory=dict)  # name -> ref -> ...
    blobs: dict[str, bytes] = field(default_factory=dict)
    log: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, Authorization
    tokens_issued: list[str] = field(default_factory=list)  # scopes

    thread_name = "oci-registry"
    keep_alive = True
    methods = ("GET", "HEAD", "PUT", "POST")

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        super().__init__()

    # --- content -------------------------------------------------------------------------------

    def put(self, name: str, references: list[str], media_type: str, body: bytes) -> str:
        digest = digest_of(body)
        repository = self.manifests.setdefault(name, {})
        for reference in [*references, digest]:
            repository[reference] = Stored(media_type, body)
        return digest

    def add_image(self, name: str, tags: list[str], arches: tuple[str, ...] = ("amd64",),
                  *, index: bool = True, label: str = "", labels: dict[str, str] | None = None,
                  variant: str = "") -> str:  # fmt: skip
        """An image with one platform per arch (an index, or one plain manifest); its digest."""
        platforms = []
        for arch in arches:
            config = json.dumps({"os": "linux", "architecture": arch, "label": label,
                                 **({"variant": variant} if variant else {}),
                                 "config": {"Labels": labels or {}}}).encode()  # fmt: skip
            self.blobs[digest_of(config)] = config
            manifest = json.dumps({
                "schemaVersion": 2, "mediaType": IMAGE,
                "config": {"mediaType": CONFIG, "digest": digest_of(config), "size": len(config)},
                "layers": [],
            }).encode()  # fmt: skip
            if not index:
                return self.put(name, tags, IMAGE, manifest)
            digest = self.put(name, [], IMAGE, manifest)
            platforms.append({"mediaType": IMAGE, "digest": digest, "size": len(manifest),
                              "platform": {"os": "linux", "architecture": arch}})  # fmt: skip
        platforms.append({"mediaType": IMAGE, "digest": "sha256:" + "0" * 64, "size": 1,
                          "platform": {"os": "unknown", "architecture": "unknown"}})  # fmt: skip
        body = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": platforms})
        return self.put(name, tags, INDEX, body.encode())

    def add_layered_image(self, name: str, tags: list[str], layers: list[bytes], *,
                          arch: str = "amd64", labels: dict[str, str] | None = None,
                          media_type: str = DOCKER_GZIP, docker: bool = True,
                          diff_ids: list[str] | None = None) -> str:  # fmt: skip
        """An image of tar layers, each stored gzip-compressed (media_type says so; another
        type stores the tar as it is), as dockerd pushes one; its manifest's digest.

        diff_ids: what the config says (default: the tars' digests, as it should)."""
        config = json.dumps({
            "os": "linux", "architecture": arch, "config": {"Labels": labels or {}},
            "rootfs": {"type": "layers",
                       "diff_ids": diff_ids or [digest_of(layer) for layer in layers]},
        }).encode()  # fmt: skip
        self.blobs[digest_of(config)] = config
        descriptors = []
        for layer in layers:
            blob = gzip.compress(layer, mtime=0) if media_type.endswith("gzip") else layer
            self.blobs[digest_of(blob)] = blob
            descriptors.append({"mediaType": media_type, "digest": digest_of(blob),
                                "size": len(blob)})  # fmt: skip
        manifest_type, config_type = (DOCKER_IMAGE, DOCKER_CONFIG) if docker else (IMAGE, CONFIG)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": manifest_type,
            "config": {"mediaType": config_type, "digest": digest_of(config),
                       "size": len(config)},
            "layers": descriptors,
        }).encode()  # fmt: skip
        return self.put(name, tags, manifest_type, manifest)

    def asked(self) -> list[tuple[str, str]]:
        """The requests since the last call: method and path."""
        asked = [(method, path) for method, path, _ in self.log]
        self.log.clear()
        return asked

    def tags(self, name: str) -> dict[str, str]:
        """tag -> digest."""
        return {
            reference: digest_of(stored.body)
            for reference, stored in self.manifests.get(name, {}).items()
            if not reference.startswith("sha256:")
        }

    # --- the API -------------------------------------------------------------------------------

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        method = handler.command
        url = urllib.parse.urlsplit(handler.path)
        body = handler.rfile.read(int(handler.headers.get("Content-Length", "0")))
        with self._lock:
            self.log.append((method, url.path, handler.headers.get("Authorization", "")))
        if url.path == "/token":
            self._token(handler, urllib.parse.parse_qs(url.query))
            return
        head = method == "HEAD"  # a HEAD answer has headers only, or keep-alive breaks
        if self._broken(handler, url.path):
            return
        name, kind, reference = _split(url.path)
        actions = "pull,push" if method in {"PUT", "POST"} else "pull"
        if self.username and not self._authorized(handler, name, method):
            realm = f"http://{self.host}/token"
            challenge = f'Bearer realm="{realm}",service="fake",scope="repository:{name}:{actions}"'
            headers = {"WWW-Authenticate": challenge}
            _send(handler, HTTPStatus.UNAUTHORIZED, b"{}", headers, head=head)
        elif kind == "blobs" and reference.startswith("uploads/"):
            self._upload(handler, name, url, body)
        elif kind == "blobs" and self.blob_storage and method == "GET":
            location = f"{self.blob_storage}?digest={reference}"
            _send(handler, HTTPStatus.TEMPORARY_REDIRECT, b"", {"Location": location})
        elif kind == "blobs":
            blob = self.blobs.get(reference)
            status = HTTPStatus.OK if blob else HTTPStatus.NOT_FOUND
            _send(handler, status, blob or b"{}", head=head)
        elif method == "PUT":
            digest = self.put(name, [reference], handler.headers["Content-Type"], body)
            _send(handler, HTTPStatus.CREATED, b"", {"Docker-Content-Digest": digest})
        else:
            stored = self.manifests.get(name, {}).get(reference)
            if stored is None:
                unknown = b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}'
                _send(handler, HTTPStatus.NOT_FOUND, unknown, head=head)
                return
            headers = {"Content-Type": stored.media_type,
                       "Docker-Content-Digest": digest_of(stored.body)}  # fmt: skip
            _send(handler, HTTPStatus.OK, stored.body, headers, head=head)

    def _broken(self, handler: BaseHTTPRequestHandler, path: str) -> bool:
        """Whether a fault answered the request: ``spoiled``, ``burst`` or ``status``."""
        method = handler.command
        head = method == "HEAD"
        if path in self.spoiled and method in {"GET", "HEAD"}:
            status, spoiled_body, headers = self.spoiled[path]
            _send(handler, status, spoiled_body, headers, head=head)
            return True
        with self._lock:
            spoiled = self.burst.pop(0) if self.burst else None
        if spoiled is not None:
            status, retry_after = spoiled
            headers = {"Retry-After": retry_after} if retry_after else {}
            _send(handler, status, b'{"errors":[{"code":"TOOMANYREQUESTS"}]}', headers, head=head)
            return True
        if self.status or (head and self.head_status):
            down = b'{"errors":[{"code":"UNAVAILABLE","message":"down"}]}'
            _send(handler, self.status or self.head_status, down, head=head)
            return True
        return False

    def _upload(self, handler: BaseHTTPRequestHandler, name: str, url: urllib.parse.SplitResult,
                body: bytes) -> None:  # fmt: skip
        if handler.command == "POST":
            with self._lock:
                number = len(self.log)
            location = f"/v2/{name}/blobs/uploads/{number}?_state=s{number}"
            _send(handler, HTTPStatus.ACCEPTED, b"", {"Location": location})
            return
        digest = urllib.parse.parse_qs(url.query).get("digest", [""])[0]
        if handler.command != "PUT" or digest != digest_of(body):
            _send(handler, HTTPStatus.BAD_REQUEST, b'{"errors":[{"code":"DIGEST_INVALID"}]}')
            return
        self.blobs[digest] = body
        _send(handler, HTTPStatus.CREATED, b"", {"Docker-Content-Digest": digest})

    def _authorized(self, handler: BaseHTTPRequestHandler, name: str, method: str) -> bool:
        header = handler.headers.get("Authorization", "")
        scope = header.removeprefix("Bearer token:")
        wanted = "push" if method in {"PUT", "POST"} else "pull"
        repository, _, actions = scope.removeprefix("repository:").rpartition(":")
        return header.startswith("Bearer ") and repository == name and wanted in actions

    def _token(self, handler: BaseHTTPRequestHandler, query: dict[str, list[str]]) -> None:
        expected = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        if handler.headers.get("Authorization") != f"Basic {expected}":
            _send(handler, HTTPStatus.UNAUTHORIZED, b'{"errors":[{"code":"DENIED"}]}')
            return
        scope = query.get("scope", [""])[0]
        self.tokens_issued.append(scope)
        _send(handler, HTTPStatus.OK, json.dumps({"token": f"token:{scope}"}).encode())


def _split(path: str) -> tuple[str, str, str]:
    """/v2/<name>/manifests/<ref> -> (name, "manifests", ref)."""
    inner = path.removeprefix("/v2/")
    for kind in ("manifests", "blobs"):
        name, found, reference = inner.rpartition(f"/{kind}/")
        if found:
            return name, kind, reference
    return inner, "", ""


def _send(handler: BaseHTTPRequestHandler, status: int, body: bytes,
          headers: dict[str, str] | None = None, *, head: bool = False) -> None:  # fmt: skip
    handler.send_response(status)
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if not head:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            handler.wfile.write(body)  # a client that refuses a blob stops reading it
