"""The reboot gate's decisions against the session's real kube-apiserver.

Each test's ``gpu_cluster`` is the GPU cluster the gate judges (tests/shared/gate_cluster.py, as
the unit tests' fault injection builds it), its objects in the real API server (gate_store.py):
the gate reads and writes them with deploy/reboot-gate's ServiceAccount token, through the real
server's validation, RBAC and admission.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import apiserver
import pytest
from gate_cluster import GateCluster
from gate_store import gate_cluster, gpu_cluster_crd, prepare


@pytest.fixture(scope="session")
def prepared(cluster: apiserver.Cluster, operator_module: Path) -> apiserver.Cluster:
    prepare(cluster, operator_module)
    return cluster


@pytest.fixture
def gpu_cluster(prepared: apiserver.Cluster, operator_module: Path,
                tmp_path: Path) -> Iterator[GateCluster]:  # fmt: skip
    """The GPU cluster a test builds, on the real API server; deleted after it."""
    with gate_cluster(prepared, operator_module, tmp_path) as made:
        yield made


@pytest.fixture
def gpu_clusters(prepared: apiserver.Cluster) -> Iterator[None]:
    """v26.7's GPUCluster CRD, for this test: the others meet the real 404 of a cluster without
    it."""
    with gpu_cluster_crd(prepared):
        yield
