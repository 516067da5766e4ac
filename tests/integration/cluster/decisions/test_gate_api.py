"""How the gate speaks to the real kube-apiserver: answers bounded in bytes, lists page by page,
a token read at every request. Its answers to failures the real server is not made to give
(5xx, 429, a hung server) are unit tests with faults injected (tests/unit/gate/test_clients.py).
"""

from __future__ import annotations

import pytest
from gate_cluster import NAMESPACE, GateCluster
from gate_store import RealStore, gate_requests

from nvidia_driver.errors import DriverError
from nvidia_driver.gate.kubeapi import PAGE_SIZE
from nvidia_driver.sources.http import Client, Limits

pytestmark = pytest.mark.cluster


def test_an_answer_over_its_byte_limit_is_refused(gpu_cluster: GateCluster) -> None:
    for index in range(20):
        gpu_cluster.add_node(f"gpu-{index}")
    api = gpu_cluster.api_client()
    api.client = Client(Limits(max_bytes=1000), gpu_cluster.context)
    # A list comes chunked, with no Content-Length: the bound stops the read part way.
    with pytest.raises(DriverError, match="answered more than 1000 bytes"):
        api.list("/api/v1/nodes")


def test_lists_are_read_page_by_page(gpu_cluster: GateCluster) -> None:
    """The real server's limit and continue token, with a label selector."""
    for index in range(260):
        gpu_cluster.api.put(f"/api/v1/nodes/n{index:03}", {"metadata": {"labels": {"gpu": "yes"}}})
    gpu_cluster.add_node("cpu-1", gpu=False)
    nodes = gpu_cluster.api_client().list("/api/v1/nodes", "gpu=yes")
    assert len(nodes) == 260
    pages = [asked for asked in gate_requests(gpu_cluster) if asked == ("list", "/api/v1/nodes")]
    assert len(pages) == -(-260 // PAGE_SIZE)


def test_the_token_is_read_at_every_request(gpu_cluster: GateCluster) -> None:
    """Kubernetes rotates a projected service account token: never one read at the start. The
    file here changes to another account's token (the namespace's default, granted nothing), so
    the real server's answer shows which token came."""
    store = gpu_cluster.api
    assert isinstance(store, RealStore)
    gpu_cluster.add_node("gpu-1")
    api = gpu_cluster.api_client()
    api.get("/api/v1/nodes/gpu-1")
    gpu_cluster.token_file.write_text(store.cluster.token(NAMESPACE, "default") + "\n")
    with pytest.raises(DriverError, match=r"answered 403: .*default"):
        api.get("/api/v1/nodes/gpu-1")
