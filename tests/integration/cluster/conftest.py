"""The cluster session's fixtures: the peers built once, one API server for the session.

``nox -s cluster`` (root on Debian 12). Each scenario takes a namespace and nodes of its own, so
they share one etcd and kube-apiserver; the logs of both and of every peer stay under the
session's temporary directory, named at the end of a run that failed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import peers
import pytest
from apiserver import Cluster, running_cluster
from fixtures.docker_env import Registry, local_registry
from fixtures.http_server import FaultyHTTPServer, Route
from flatcar_feed import feed_from_tsv
from reboot_scenario import RebootScenario

LOGS = pytest.StashKey[Path]()


@pytest.fixture(scope="session")
def peer_dirs() -> dict[str, Path]:
    """Each peer's binaries (built unless the cache has them)."""
    return {name: peers.build(peer) for name, peer in peers.load().items()}


@pytest.fixture(scope="session")
def operator_module() -> Path:
    """The GPU Operator's module, as the build read it: its assets, CRDs and samples."""
    return peers.module_dir(peers.load()["gpu-operator"])


@pytest.fixture(scope="session")
def cluster(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    peer_dirs: dict[str, Path],
) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("cluster")
    request.config.stash[LOGS] = workdir / "logs"
    with running_cluster(workdir, peer_dirs["kube-apiserver"] / "kube-apiserver") as running:
        yield running


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """Debian's docker-registry on 127.0.0.1, one for each test module: its images are its own."""
    with local_registry(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="session")
def releases_feed() -> Iterator[str]:
    """releases.json in the real feed's shape (tests/shared/flatcar_feed.py), on 127.0.0.1."""
    body = json.dumps(feed_from_tsv()).encode()
    routes = {"/releases.json": Route(body, "application/json")}
    with FaultyHTTPServer(routes) as server:
        yield f"{server.url}/releases.json"


@pytest.fixture
def rebooting(cluster: Cluster, operator_module: Path, peer_dirs: dict[str, Path],
              registry: Registry, releases_feed: str) -> RebootScenario:  # fmt: skip
    """What a reboot manager's scenario runs with (reboot_scenario.py)."""
    return RebootScenario(cluster, operator_module, peer_dirs, registry, releases_feed)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:  # fmt: skip
    logs = config.stash.get(LOGS, None)
    if exitstatus != 0 and logs is not None:
        terminalreporter.write_line(f"The API server's and the peers' logs: {logs}")
