"""etcd and the real kube-apiserver on 127.0.0.1: a CA of their own, RBAC on, nothing else.

No controller-manager, scheduler or kubelet runs. What a controller-manager would do and a
scenario needs (a ``default`` ServiceAccount in each namespace) the fixture does through the API;
what a kubelet would write (a pod's status) a scenario writes through the API as the kubelet does
(``PATCH .../pods/<name>/status``), and says so.

The service CIDR is 198.18.0.0/24 (RFC 2544's benchmarking range): the API server allocates the
``kubernetes`` Service's address from it, and nothing is ever sent there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from fixtures.cache import cache_dir, cached_dir
from fixtures.docker_env import free_port, stop_process
from fixtures.kernel_headers import download, resolve
from fixtures.shell import run

ETCD_PACKAGE, ETCD_SUITE = "etcd-server", "trixie"  # 3.5: Kubernetes 1.36 supports etcd >= 3.5
SERVICE_CIDR = "198.18.0.0/24"
ISSUER = "https://kubernetes.default.svc"
START_SECONDS = 120.0
ADMIN = "gdc-admin"  # CN of the admin client certificate, in group system:masters
RETRIES, TOO_MANY_REQUESTS = 10, 429
# What each request was (who, which verb, which URI), one JSON line each, written before the
# answer goes out (blocking mode): the record a test reads of what a client asked.
AUDIT_LOG = "audit.log"
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
                "omitStages": ["RequestReceived"], "rules": [{"level": "Metadata"}]}  # fmt: skip


def etcd_binary() -> Path:
    """etcd from Debian's etcd-server package (trixie's 3.5), unpacked once into the cache."""
    package = resolve(ETCD_PACKAGE, suite=ETCD_SUITE)
    (deb,) = download([package])

    def unpack(tmp: Path) -> None:
        run(["dpkg-deb", "-x", deb, tmp])

    root = cached_dir(cache_dir() / "etcd" / deb.stem, unpack)
    return root / "usr" / "bin" / "etcd"


# --- the CA and the certificates ------------------------------------------------------------


def _openssl(*args: str | Path, cwd: Path) -> None:
    run(["openssl", *args], cwd=cwd)


def make_pki(directory: Path) -> None:
    """ca, the server's certificate (127.0.0.1, localhost, the in-cluster names), an admin
    client certificate, and the service-account signing key."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=gdc-test-ca",
             cwd=directory)  # fmt: skip
    names = "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc"
    for name, subject, extensions in (
        ("apiserver", "/CN=kube-apiserver", f"subjectAltName={names}\nextendedKeyUsage=serverAuth"),
        ("admin", f"/O=system:masters/CN={ADMIN}", "extendedKeyUsage=clientAuth"),
    ):
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
                 cwd=directory)  # fmt: skip
        (directory / f"{name}.ext").write_text(extensions + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                 "-out", f"{name}.crt", cwd=directory)  # fmt: skip
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
             "-out", "sa.key", cwd=directory)  # fmt: skip
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)


# --- the API, as a client with the admin certificate or a token ----------------------------


class APIError(Exception):
    def __init__(self, status: int, body: Mapping[str, Any], what: str) -> None:
        super().__init__(f"{what}: {status} {body.get('reason', '')}: {body.get('message', '')}")
        self.status = status
        self.body = body


@dataclass
class Cluster:
    url: str
    pki: Path
    logs: Path
    _paths: dict[tuple[str, str], tuple[str, bool]] = field(default_factory=dict)

    @property
    def ca(self) -> Path:
        return self.pki / "ca.crt"

    def _context(self, token: str | None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        if token is None:
            context.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
        return context

    def request(self, method: str, path: str, body: object = None, *, token: str | None = None,
                content_type: str = "application/json") -> dict[str, Any]:  # fmt: skip
        """One exchange as the admin (or the token's user); APIError for a non-2xx answer."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)  # noqa: S310
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        for _ in range(RETRIES):
            try:
                opened = urllib.request.urlopen(  # noqa: S310 - https to the session's API server
                    request, context=self._context(token), timeout=30
                )
                with opened as r:
                    answer = r.read()
            except urllib.error.HTTPError as error:
                raw = error.read()
                parsed = json.loads(raw) if raw.startswith(b"{") else {"message": raw.decode()}
                # A new CRD's storage answers 429 with Retry-After for a moment after it is
                # Established ("storage is (re)initializing"); client-go waits and retries.
                if error.code == TOO_MANY_REQUESTS:
                    time.sleep(float(error.headers.get("Retry-After") or 1))
                    continue
                raise APIError(error.code, parsed, f"{method} {path}") from None
            return json.loads(answer) if answer else {}
        raise APIError(TOO_MANY_REQUESTS, {}, f"{method} {path}, {RETRIES} times")

    def get(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self.request("GET", path, **kwargs)

    def node_metadata(self, node: str, key: str) -> dict[str, str]:
        """A node's ``annotations`` or ``labels`` as the API server has them now."""
        return dict(self.get(f"/api/v1/nodes/{node}")["metadata"].get(key) or {})

    def audit_size(self) -> int:
        """Where the audit log ends now: requests_of reads from there."""
        return (self.logs / AUDIT_LOG).stat().st_size

    def requests_of(self, user: str, since: int = 0) -> list[tuple[str, str]]:
        """(verb, request URI) of each request user made since that point, in order, from the
        audit log."""
        with (self.logs / AUDIT_LOG).open("rb") as log:
            log.seek(since)
            lines = log.read().decode().splitlines()
        events = [json.loads(line) for line in lines if line.strip()]
        return [(event["verb"], event["requestURI"]) for event in events
                if event.get("user", {}).get("username") == user
                and event.get("stage") == "ResponseComplete"]  # fmt: skip

    def delete(self, path: str) -> None:
        """DELETE the object at path; one already gone is fine."""
        try:
            self.request("DELETE", path)
        except APIError as error:
            if error.status != 404:
                raise

    @contextlib.contextmanager
    def deleted_after(self, *paths: str) -> Iterator[Cluster]:
        """The cluster, with the objects at paths deleted after the scenario (also on failure):
        the scenarios share one API server, and the Operator's render a DaemonSet for every
        driver resource and node they find."""
        try:
            yield self
        finally:
            for path in paths:
                self.delete(path)

    def items(self, path: str, selector: str = "") -> list[dict[str, Any]]:
        query = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        return list(self.get(path + query).get("items") or [])

    # -- objects by apiVersion and kind, their paths found by discovery, as kubectl does --

    def path_of(self, document: Mapping[str, Any], *, name: bool = True) -> str:
        api_version, kind = document["apiVersion"], document["kind"]
        if (api_version, kind) not in self._paths:
            base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
            for resource in self.get(base)["resources"]:
                if "/" not in resource["name"]:
                    key = (api_version, resource["kind"])
                    self._paths[key] = (f"{base}", bool(resource["namespaced"]))
                    self._paths[(api_version, "plural:" + resource["kind"])] = (
                        resource["name"], False)  # fmt: skip
        base, namespaced = self._paths[(api_version, kind)]
        plural = self._paths[(api_version, "plural:" + kind)][0]
        metadata = document.get("metadata", {})
        path = base
        if namespaced:
            path += f"/namespaces/{metadata.get('namespace') or 'default'}"
        path += f"/{plural}"
        return f"{path}/{metadata['name']}" if name else path

    def apply(self, document: Mapping[str, Any]) -> dict[str, Any]:
        """Create the object, or replace it (with its current resourceVersion) if it exists."""
        try:
            return self.request("POST", self.path_of(document, name=False), document)
        except APIError as error:
            if error.status != 409:
                raise
        current = self.get(self.path_of(document))
        replaced = json.loads(json.dumps(document))
        replaced.setdefault("metadata", {})["resourceVersion"] = current["metadata"][
            "resourceVersion"
        ]
        return self.request("PUT", self.path_of(document), replaced)

    def apply_files(self, paths: Iterable[Path]) -> list[dict[str, Any]]:
        documents = [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]
        return [self.apply(document) for document in documents]

    def wait_established(self, crd_name: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            crd = self.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd_name}")
            conditions = crd.get("status", {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                self._paths.clear()  # discovery changed
                return
            time.sleep(0.5)
        raise TimeoutError(f"CRD {crd_name} not established within 60 s")

    def namespace(self, name: str) -> None:
        """A namespace and its ``default`` ServiceAccount (the controller-manager's job)."""
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        self.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": "default", "namespace": name}})  # fmt: skip

    def token(self, namespace: str, account: str, seconds: int = 3600) -> str:
        """A bound service-account token, as the kubelet asks for a pod's (TokenRequest)."""
        answer = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": seconds}},
        )  # fmt: skip
        return str(answer["status"]["token"])

    def kubeconfig(self, path: Path, token: str | None = None) -> Path:
        """A kubeconfig for a Go peer: the admin's certificate, or a token."""
        user: dict[str, str] = (
            {"token": token}
            if token is not None
            else {"client-certificate": str(self.pki / "admin.crt"),
                  "client-key": str(self.pki / "admin.key")}
        )  # fmt: skip
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "gdc", "cluster": {"server": self.url,
                                                     "certificate-authority": str(self.ca)}}],
            "users": [{"name": "gdc", "user": user}],
            "contexts": [{"name": "gdc", "context": {"cluster": "gdc", "user": "gdc"}}],
            "current-context": "gdc",
        }  # fmt: skip
        path.write_text(json.dumps(config))
        return path


# --- starting and stopping ------------------------------------------------------------------


def _wait_ready(url: str, context: ssl.SSLContext, process: subprocess.Popen[bytes],
                log: Path) -> None:  # fmt: skip
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{log.stem} exited {process.returncode}:\n{_tail(log)}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(url, context=context, timeout=5) as answer,  # noqa: S310 - loopback
        ):
            if answer.status == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"{log.stem} not ready within {START_SECONDS:.0f} s:\n{_tail(log)}")


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _start(argv: list[str], log: Path, env: Mapping[str, str] | None = None
           ) -> subprocess.Popen[bytes]:  # fmt: skip
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                env=dict(env or os.environ), start_new_session=True)  # fmt: skip


@contextlib.contextmanager
def running_cluster(workdir: Path, kube_apiserver: Path) -> Iterator[Cluster]:
    """etcd and kube-apiserver, stopped on the way out (also on failure); their logs stay in
    ``workdir/logs``."""
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    pki = workdir / "pki"
    make_pki(pki)
    etcd_client, etcd_peer, secure = free_port(), free_port(), free_port()
    started: list[subprocess.Popen[bytes]] = []
    try:
        etcd_log = logs / "etcd.log"
        started.append(_start([
            str(etcd_binary()), "--data-dir", str(workdir / "etcd"), "--name", "gdc",
            "--listen-client-urls", f"http://127.0.0.1:{etcd_client}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_client}",
            "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-cluster", f"gdc=http://127.0.0.1:{etcd_peer}",
            "--listen-metrics-urls", f"http://127.0.0.1:{free_port()}",
        ], etcd_log))  # fmt: skip
        _wait_ready(f"http://127.0.0.1:{etcd_client}/health", ssl.create_default_context(),
                    started[0], etcd_log)  # fmt: skip
        apiserver_log = logs / "kube-apiserver.log"
        policy = workdir / "audit-policy.json"
        policy.write_text(json.dumps(AUDIT_POLICY))
        started.append(_start([
            str(kube_apiserver),
            f"--etcd-servers=http://127.0.0.1:{etcd_client}",
            "--bind-address=127.0.0.1", f"--secure-port={secure}",
            "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",  # as kubeadm runs it: the driver pod is privileged
            f"--service-account-issuer={ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--profiling=false",
            f"--audit-policy-file={policy}", f"--audit-log-path={logs / AUDIT_LOG}",
            "--audit-log-format=json", "--audit-log-mode=blocking",
        ], apiserver_log))  # fmt: skip
        cluster = Cluster(f"https://127.0.0.1:{secure}", pki, logs)
        context = ssl.create_default_context(cafile=str(cluster.ca))
        context.load_cert_chain(pki / "admin.crt", pki / "admin.key")
        _wait_ready(f"{cluster.url}/readyz", context, started[1], apiserver_log)
        yield cluster
    finally:
        for process in reversed(started):
            stop_process(process)
        shutil.rmtree(workdir / "etcd", ignore_errors=True)
