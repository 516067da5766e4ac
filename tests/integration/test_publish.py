"""``invoke publish`` end to end: a releases feed, Debian's registry and real builds, all local.

The feed is the real one's shape (tests/shared/flatcar_feed.py), holding the signed test
releases (Debian trixie's 6.12.117 kernel, which the loopback release server carries) and the
markers: not the recent-releases table too, whose majors (3975-4790) would make the test
releases' 9999 implausible (gdc.coverage skips a version over 1,000 majors above the rest).
The versions file covers the stable channel, amd64 and the
fixture driver, so the matrix is one build image and one precompiled image per kernel; the
images the session built before (fixtures/images.py) make the first run cheap: publish runs
from a copy of the tree (so a test can change an entrypoint file) that reports this checkout's
commit, so its builds are the session's, layer for layer.

One scenario, in order, on one registry, with no compile of its own:

1. from empty, every image of the matrix is built and pushed;
2. a second run builds nothing;
3. an entrypoint file changes and a new stable release with the same kernel enters the feed,
   the old one staying live (pinned): the build image is rebuilt because of the entrypoint,
   the precompiled image because its base changed and it lacks the new release; the registry
   is stopped halfway (the build image is in, the precompiled one is not): it fails, saying so;
4. with the registry back, a re-run builds only the precompiled image, which now carries both
   releases and answers every tag of both, cross-release ones included; it compiles nothing:
   its build reuses the packages of the image it replaces (the same kernel banner, sources,
   patches and build code; the entrypoint fix is in log.py), so the scenario's one compile is
   the session's;
5. a last run builds nothing, through a proxy that answers the first requests with 429: the
   retries ride it out; its requests and seconds are what an hourly no-op run costs;
6. an arm64 image (the precompiled image's own config, relabelled) is put under the
   precompiled image's amd64 staging tag, as a misrouted arch job would push it: the nightly's
   merge step (``--step merge``) fails that image, saying which platform it found, and leaves
   its tags as they were; the build image is still up to date.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import shutil
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fixtures.daemonset import image_packages
from fixtures.docker_env import (
    DockerDaemon,
    docker_env,
    free_port,
    local_registry,
    remove_repository,
)
from fixtures.driver_server import DriverDownloads
from fixtures.gpg import SigningKey
from fixtures.http_server import FaultyHTTPServer, Route
from fixtures.images import DRIVER, ROOT
from fixtures.release_server import TEST_RELEASE, FlatcarReleaseServer
from flatcar_feed import feed_entry, with_markers

from gdc import context
from gdc.registry import Registry
from nvidia_driver.formats.oci import Manifest

pytestmark = pytest.mark.integration

NEW_RELEASE = "9999.2.1"  # a stable point release with the same kernel, as Flatcar often ships
KERNEL = TEST_RELEASE.kernel.release
KERNEL_TAG = KERNEL.replace("+", "-")
RUN_TIMEOUT = 3600
MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json, "
    "application/vnd.docker.distribution.manifest.v2+json"
)
VERSIONS = """\
[images]
channels = ["stable"]
arches = ["amd64"]
pinned = {pinned}

[drivers."{driver}"]
sha256 = {{ amd64 = "{sha256}" }}

[drivers."{driver}".redist]
{redist}
"""


def _redist_table(downloads: DriverDownloads) -> str:
    """The fixture archives' digests, as versions.toml records NVIDIA's."""
    lines = []
    for item in downloads.redist_sha256.split(","):
        key, digest = item.split("=", 1)
        component = key.split(".", 1)[0]
        lines.append(f'{component} = {{ version = "recorded", amd64 = "{digest}" }}')
    return "\n".join(lines)


def _feed(*releases: str) -> bytes:
    """The test releases (amd64 only, as the fixture server has) with the feed's markers."""
    feed = {version: feed_entry("stable", "2026-11-20", KERNEL, "amd64") for version in releases}
    return json.dumps(with_markers(feed), indent=1).encode()


@dataclass
class Publisher:
    """``invoke publish`` as the nightly workflow runs it, against loopback stand-ins."""

    feed: FaultyHTTPServer
    registry_dir: Path
    port: int
    argv: list[str]
    registry_stack: ExitStack = field(default_factory=ExitStack)
    env: dict[str, str] = field(default_factory=docker_env)

    tree: Path = Path()
    versions: Path = Path()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_registry(self) -> None:
        self.registry_stack.enter_context(local_registry(self.registry_dir, self.port))

    def stop_registry(self) -> None:
        self.registry_stack.close()

    def publish_feed(self, *releases: str) -> None:
        self.feed.add_route("/releases.json", Route(_feed(*releases), "application/json"))

    def run(self, *, stop_registry_at: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run invoke publish; stop the registry when a line containing stop_registry_at shows."""
        stdout: list[str] = []
        stderr: list[str] = []
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        with subprocess.Popen(self.argv, cwd=ROOT, env=self.env, text=True, **pipes) as process:
            reader = threading.Thread(target=lambda: stderr.extend(process.stderr or ()))
            reader.start()
            for line in process.stdout or ():
                stdout.append(line)
                if stop_registry_at is not None and stop_registry_at in line:
                    self.stop_registry()
                    stop_registry_at = None
            process.wait(RUN_TIMEOUT)
            reader.join(30)
        return subprocess.CompletedProcess(self.argv, process.returncode, "".join(stdout),
                                           "".join(stderr))  # fmt: skip

    def restage(self, tag: str, architecture: str, variant: str) -> None:
        """Put the image under tag again with another platform in its config, labels and all."""
        client = Registry(self.address)
        manifest = client.manifest("gdc/driver", tag)
        config = {**client.config("gdc/driver", manifest), "architecture": architecture,
                  "variant": variant}  # fmt: skip
        body = json.dumps(config).encode()
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        # A monolithic upload, as the distribution spec has it: POST for a location, PUT the
        # bytes there with their digest.
        start = urllib.request.Request(f"http://{self.address}/v2/gdc/driver/blobs/uploads/",
                                       data=b"", method="POST")  # fmt: skip
        with urllib.request.urlopen(start, timeout=30) as started:  # noqa: S310 - loopback
            location = urllib.parse.urljoin(f"http://{self.address}/", started.headers["Location"])
        joined = "&" if "?" in location else "?"
        upload = urllib.request.Request(  # noqa: S310 - the loopback registry's location
            f"{location}{joined}digest={digest}", data=body,
            headers={"Content-Type": "application/octet-stream"}, method="PUT",
        )  # fmt: skip
        with urllib.request.urlopen(upload, timeout=30):  # noqa: S310 - the loopback registry
            pass
        document = manifest.json()
        document["config"] = {**document["config"], "digest": digest, "size": len(body)}
        relabelled = json.dumps(document).encode()
        digest = "sha256:" + hashlib.sha256(relabelled).hexdigest()
        client.put_manifest("gdc/driver", tag, Manifest(manifest.media_type, relabelled, digest))

    def digest(self, tag: str) -> str | None:
        request = urllib.request.Request(
            f"http://{self.address}/v2/gdc/driver/manifests/{tag}",
            headers={"Accept": MANIFEST_TYPES},
            method="HEAD",
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
                return str(response.headers["Docker-Content-Digest"])
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise


@pytest.fixture(scope="module")
def publisher(  # noqa: PLR0917 - pytest passes fixtures by name
    tmp_path_factory: pytest.TempPathFactory,
    docker_daemon: DockerDaemon,
    docker_base_image: str,
    driver_downloads: DriverDownloads,
    flatcar_release_server_session: FlatcarReleaseServer,
    flatcar_signing_key: SigningKey,
) -> Iterator[Publisher]:
    server = flatcar_release_server_session
    server.also_serve_as(NEW_RELEASE)
    scratch = tmp_path_factory.mktemp("publish")
    versions = scratch / "versions.toml"
    versions.write_text(VERSIONS.format(driver=DRIVER, sha256=driver_downloads.runfile_sha256,
                                        pinned="[]",
                                        redist=_redist_table(driver_downloads)))  # fmt: skip
    tree = _copy_tree(scratch / "tree")
    (scratch / "registry").mkdir()
    with FaultyHTTPServer({}) as feed:
        port = free_port()
        argv = [
            sys.executable, "-m", "invoke", "--search-root", str(tree), "publish",
            "--registry", f"127.0.0.1:{port}/gdc", "--versions-file", str(versions),
            "--releases-url", f"{feed.url}/releases.json",
            "--base-image", docker_base_image,
            "--driver-base-url", driver_downloads.driver_base_url,
            "--fabricmanager-base-url", driver_downloads.fabricmanager_base_url,
            "--release-base-url", server.base_url,
            "--flatcar-keyring", str(flatcar_signing_key.public_keyring),
            "--docker-host", docker_daemon.host,
            # gzip: the suite's dockerd is Debian 12's 20.10, which cannot pull zstd layers, and
            # a precompiled build starts from its build image's staging tag and pulls the image
            # it replaces (zstd layers are test_zstd_layers.py's, read by containerd).
            "--compression", "gzip",
        ]  # fmt: skip
        git_dir = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--absolute-git-dir"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        env = {**docker_env(), **({"GIT_DIR": git_dir} if git_dir else {})}
        publisher = Publisher(feed, scratch / "registry", port, argv, env=env)
        publisher.tree, publisher.versions = tree, versions
        publisher.start_registry()
        try:
            yield publisher
        finally:
            publisher.stop_registry()
            # Its builds are tagged for this registry alone (several GB): untagged, as the
            # session's own registry's are (fixtures/images.py).
            remove_repository(f"127.0.0.1:{port}/gdc/driver")


def _copy_tree(destination: Path) -> Path:
    """What invoke publish reads of the repository, copied so a test may change it."""
    for part in ("tasks.py", "tooling", "entrypoint/src", "images", *context.LEGAL_FILES):
        source = ROOT / part
        target = destination / part
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    return destination


@contextmanager
def throttling_proxy(upstream: str, burst: int) -> Iterator[dict[str, Any]]:
    """A reverse proxy on 127.0.0.1 in front of upstream: the first burst requests get 429."""
    state: dict[str, Any] = {"requests": 0, "throttled": 0, "lock": threading.Lock()}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _relay(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with state["lock"]:
                state["requests"] += 1
                throttled = state["throttled"] < burst
                state["throttled"] += throttled
            if throttled:
                self.send_response(429)
                self.send_header("Retry-After", "1")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            connection = http.client.HTTPConnection(upstream, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            connection.request(self.command, self.path, body or None, headers)
            answer = connection.getresponse()
            data = answer.read()
            self.send_response(answer.status)
            for key, value in answer.getheaders():
                if key.lower() not in {"content-length", "transfer-encoding", "connection"}:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            connection.close()

        do_GET = do_HEAD = do_PUT = _relay  # noqa: N815 - http.server's names

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state["address"] = f"127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def _package_files(publisher: Publisher, tag: str) -> dict[str, object]:
    """Each package of the registry's image under tag: its files and their SHA-256s."""
    found = image_packages(f"{publisher.address}/gdc/driver:{tag}")
    return {f"{p['module_type']} {p['banner']}": p["files"] for p in found}


def _summary(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout[result.stdout.rindex("Summary for") :]


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    return _summary(result)


BUILD_TAG = f"{DRIVER}-flatcar"


def _precompiled_tags(release: str) -> tuple[str, str]:
    return f"{DRIVER}-flatcar{release}", f"535-{KERNEL_TAG}-flatcar{release}"


def test_publish_builds_what_is_missing_or_changed_and_only_that(publisher: Publisher) -> None:
    current = TEST_RELEASE.version
    publisher.publish_feed(current)

    first = _ok(publisher.run())
    assert "built 2" in first, first
    for tag in (BUILD_TAG, f"{BUILD_TAG}-flatcar{current}", *_precompiled_tags(current)):
        assert publisher.digest(tag), f"{tag} was not pushed\n{first}"
    packages = _package_files(publisher, _precompiled_tags(current)[0])

    second = _ok(publisher.run())
    assert "skipped 2" in second, second
    assert "built" not in second, second

    # An entrypoint fix, and a new stable release of the same kernel while the old one stays
    # live; the registry goes away before the precompiled image is pushed.
    log_py = publisher.tree / "entrypoint/src/nvidia_driver/log.py"
    log_py.write_text(log_py.read_text() + "# a fix\n")
    publisher.versions.write_text(publisher.versions.read_text().replace(
        "pinned = []", f'pinned = ["{current}"]'))  # fmt: skip
    publisher.publish_feed(current, NEW_RELEASE)
    interrupted = publisher.run(stop_registry_at="[2/2] precompiled")
    assert interrupted.returncode != 0
    summary = _summary(interrupted)
    assert "built 1" in summary, summary
    assert "failed 1" in summary, summary
    assert "amd64: the entrypoint changed" in summary, summary
    assert "images failed (see the summary); fix the cause and re-run" in interrupted.stderr

    publisher.start_registry()
    assert publisher.digest(f"{BUILD_TAG}-flatcar{NEW_RELEASE}")
    resumed_run = publisher.run()
    resumed = _ok(resumed_run)
    assert "built 1" in resumed, resumed
    assert "skipped 1" in resumed, resumed
    assert f"amd64: the base image changed; it lacks packages for Flatcar {NEW_RELEASE}" in \
        resumed, resumed  # fmt: skip
    # Both module types' packages are the replaced image's, file for file: no tree, no make
    # (a compile writes other bytes: its build directory's name is in the objects).
    assert "Building kernel modules" not in resumed_run.stdout, resumed_run.stdout[-6000:]
    assert _package_files(publisher, _precompiled_tags(NEW_RELEASE)[0]) == packages
    # One image for the kernel, under every tag of both releases, the cross-release ones too.
    tags = [tag for release in (current, NEW_RELEASE) for tag in _precompiled_tags(release)]
    digests = {tag: publisher.digest(tag) for tag in tags}
    assert len(set(digests.values())) == 1, digests
    assert None not in digests.values(), digests

    with throttling_proxy(publisher.address, burst=3) as proxy:
        argv = [proxy["address"] + "/gdc" if arg == f"{publisher.address}/gdc" else arg
                for arg in publisher.argv]  # fmt: skip
        result = subprocess.run(argv, cwd=ROOT, env=publisher.env, capture_output=True,
                                text=True, timeout=RUN_TIMEOUT, check=False)  # fmt: skip
    last = _ok(result)
    assert "skipped 2" in last, last
    assert "built" not in last, last
    assert proxy["throttled"] == 3
    cost = result.stdout.splitlines()[-1]
    # The run's one retry budget, and what the three 429s took of it (gdc.registry RetryBudget).
    assert cost.startswith(f"registry: {proxy['requests']} requests (3 retried; "), cost
    assert "of the run's 120 s retry budget waited) in " in cost, cost
    print(f"no-op publish through the proxy: {cost}")

    _a_wrong_arch_fails_that_image_only(publisher, tags)


def _a_wrong_arch_fails_that_image_only(publisher: Publisher, tags: list[str]) -> None:
    """An arm64 image under the precompiled image's amd64 staging tag: that image fails, alone."""
    staging = f"{DRIVER}-{KERNEL_TAG}-amd64"
    publisher.restage(staging, "arm64", "v8")
    before = {tag: publisher.digest(tag) for tag in tags}
    merge = subprocess.run([*publisher.argv, "--step", "merge"], cwd=ROOT, env=publisher.env,
                           capture_output=True, text=True, timeout=RUN_TIMEOUT,
                           check=False)  # fmt: skip
    wrong = _summary(merge)
    assert merge.returncode == 1, wrong
    assert "skipped 1, failed 1" in wrong, wrong
    assert (f"the amd64 image under {staging} is not what this run would merge (it is a "
            "linux/arm64/v8 image, not linux/amd64): not merged; stage it again") in wrong, \
        wrong  # fmt: skip
    assert {tag: publisher.digest(tag) for tag in tags} == before


def test_an_unreachable_feed_builds_nothing(publisher: Publisher) -> None:
    argv = [a if not a.endswith("/releases.json") else "http://127.0.0.1:9/releases.json"
            for a in publisher.argv]  # fmt: skip
    result = subprocess.run(argv, cwd=ROOT, env=docker_env(), capture_output=True, text=True,
                            timeout=300, check=False)  # fmt: skip
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "nothing was built" in lines[0]
    assert "Summary" not in result.stdout
