"""The gate's HTTP exchanges: bounded in time and bytes; the answers it retries, and how it
reads a failure."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Cluster
from fake_apiserver import Fault
from raw_server import accepting, raw_server

from nvidia_driver.errors import DriverError
from nvidia_driver.gate.gate import Settings
from nvidia_driver.gate.kubeapi import ConflictError, KubeAPI, NotFoundError
from nvidia_driver.gate.managers import Manager
from nvidia_driver.gate.verdict import allowed, held
from nvidia_driver.settings import REBOOT_GATE_ANNOTATION, REBOOT_GATE_PREPULL
from nvidia_driver.sources.download import Backoff
from nvidia_driver.sources.http import Client, Limits, Response, UnreachableError, send_retried


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers: a hung API server or registry."""
    with accepting(lambda _connection, stop: stop.wait()) as port:
        yield f"http://127.0.0.1:{port}"


def test_an_exchange_ends_by_its_deadline(silent_server: str) -> None:
    client = Client(Limits(timeout=0.2, deadline=0.5))
    with pytest.raises(UnreachableError, match=r"^GET http://127\.0\.0\.1:\d+/x failed: timed out"):
        client.send("GET", f"{silent_server}/x")


def test_a_body_trickled_past_the_deadline_ends_by_it_read_whole_or_streamed() -> None:
    """The gate reads answers whole, the tooling streams blobs: both within one deadline."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
    client = Client(Limits(timeout=3.0, deadline=1.0))
    with raw_server(head, *[b"x"] * 1000, pause=0.1) as url:
        started = time.monotonic()
        with pytest.raises(UnreachableError, match=r"did not answer within 1 s$"):
            client.send("GET", url)
        with client.open("GET", url) as answer, pytest.raises(UnreachableError):
            b"".join(iter(lambda: answer.read(100), b""))
    assert time.monotonic() - started < 2 * 1.0 + 1.5


def test_a_content_length_of_other_digits_is_no_length() -> None:
    """Latin-1's superscript two is str.isdigit(), not RFC 9110's digits: the body is read as
    sent (to its bound), not a traceback from int()."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\nConnection: close\r\n\r\n"
    with raw_server(head, b"{}") as url:
        assert Client(Limits(timeout=3.0, deadline=5.0)).send("GET", url).body == b"{}"


def test_a_body_cut_short_of_its_content_length_is_unreachable_not_a_short_answer() -> None:
    """A proxy or server that drops the connection mid-body: another try may do, and a cut
    manifest or Node is not read as the whole answer (a JSON error, not retried)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
    with (
        raw_server(head, b"{" * 500) as url,
        pytest.raises(UnreachableError, match=r"truncated: 500 bytes short of its Content-Length$"),
    ):
        Client(Limits(timeout=3.0, deadline=5.0)).send("GET", url)


def test_a_streamed_body_cut_short_of_its_content_length_is_unreachable_not_its_end() -> None:
    """The tooling streams blobs: a cut one is a transfer that broke off, not a damaged blob."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
    with (
        raw_server(head, b"x" * 500) as url,
        Client(Limits(timeout=3.0, deadline=5.0)).open("GET", url) as answer,
        pytest.raises(UnreachableError, match=r"truncated: 500 bytes short of its Content-Length$"),
    ):
        b"".join(iter(lambda: answer.read(100), b""))


def test_a_409_is_a_conflict_and_not_retried(cluster: Cluster) -> None:
    """The gate's caller reads the object again and decides again (test_fluo.py)."""
    cluster.add_node("gpu-1")
    cluster.api.faults.append(Fault("PATCH", "/api/v1/nodes/gpu-1", 409))
    with pytest.raises(ConflictError, match=r"answered 409: injected fault$"):
        cluster.api_client().merge_patch("/api/v1/nodes/gpu-1", {"metadata": {}})
    assert cluster.sleeps == []


def test_5xx_answers_are_retried_a_bounded_number_of_times(cluster: Cluster) -> None:
    cluster.add_node("gpu-1")
    api = cluster.api_client()
    cluster.api.faults.append(Fault("GET", "/api/v1/nodes/gpu-1", 503, times=2))
    assert api.get("/api/v1/nodes/gpu-1")["metadata"]["name"] == "gpu-1"
    cluster.api.faults.append(Fault("GET", "/api/v1/nodes/gpu-1", 500, times=3))
    with pytest.raises(DriverError) as caught:
        api.get("/api/v1/nodes/gpu-1")
    assert (
        str(caught.value) == "Kubernetes API: GET /api/v1/nodes/gpu-1 answered 500: injected fault"
    )
    assert cluster.sleeps == [0.5, 1.0, 0.5, 1.0]


@pytest.mark.parametrize(
    ("value", "slept"),
    [("7", 7.0), ("3600", 30.0), ("", 0.5), ("soon", 0.5), ("\xb2", 0.5), ("\u0661\u0662", 0.5)],
)  # Latin-1's superscript two and Arabic-Indic 12 are str.isdigit(), not RFC 9110's digits
def test_retry_after_is_honoured_up_to_its_cap_and_never_breaks_the_gate(
    value: str, slept: float
) -> None:
    answers = [Response(503, {"retry-after": value}, b""), Response(200, {}, b"{}")]
    sleeps: list[float] = []
    response = send_retried(lambda: answers.pop(0), Backoff(attempts=2, first_delay=0.5),
                            sleeps.append)  # fmt: skip
    assert response.status == 200
    assert sleeps == [slept]


@pytest.mark.parametrize("status", [401, 403])
def test_a_missing_object_and_a_refused_one_say_so(cluster: Cluster, status: int) -> None:
    api = cluster.api_client()
    with pytest.raises(NotFoundError, match=r'answered 404: nodes "nope" not found$'):
        api.get("/api/v1/nodes/nope")
    cluster.api.faults.append(Fault("DELETE", "/api/v1/nodes/nope", status))
    with pytest.raises(DriverError) as caught:
        api._answer("DELETE", "/api/v1/nodes/nope")
    assert str(caught.value) == (
        f"Kubernetes API: DELETE /api/v1/nodes/nope answered {status}: injected fault; check "
        "the gate's service account and RBAC (deploy/reboot-gate)"
    )


def test_the_token_never_crosses_the_network_in_clear() -> None:
    with pytest.raises(DriverError, match=r"refusing plain http to the Kubernetes API at 10\.0\."):
        KubeAPI("http://10.0.0.1:6443")
    KubeAPI("http://127.0.0.1:8001")  # kubectl proxy


def test_the_in_cluster_api_server_comes_from_the_pods_environment(tmp_path: Path) -> None:
    api = KubeAPI.from_env(
        {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"},
        service_account=tmp_path,
    )
    assert api.base_url == "https://[fd00::1]:443"
    with pytest.raises(DriverError, match="not in a Kubernetes pod"):
        KubeAPI.from_env({}, service_account=tmp_path)


def test_the_api_server_is_asked_directly_whatever_proxy_the_environment_names(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster's no_proxy names its service network as a CIDR range, which Python's proxy
    rules do not read: the in-cluster API server would be asked through the proxy."""
    cluster.add_node("gpu-1")
    for variable in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(variable, "http://127.0.0.1:9")  # nothing listens: a proxy fails
    for variable in ("no_proxy", "NO_PROXY"):
        monkeypatch.setenv(variable, "10.96.0.0/12")
    api = KubeAPI.from_env({"REBOOT_GATE_API_SERVER": cluster.api.url}, service_account=tmp_path)

    assert api.get("/api/v1/nodes/gpu-1")["metadata"]["name"] == "gpu-1"


@pytest.mark.parametrize(
    ("name", "value"),
    [("NODE_NAME", "gpu-1\nRebootAllowed"), ("POD_NAMESPACE", "gate\u2028x"),
     ("POD_NAME", "pod\rx"), (REBOOT_GATE_ANNOTATION, "gpu-driver-container/ok\x1b[2J")],
)  # fmt: skip
def test_a_name_from_the_environment_with_a_line_break_is_refused(name: str, value: str) -> None:
    env = {"NODE_NAME": "gpu-1", "POD_NAMESPACE": "gate", "POD_NAME": "pod", name: value}
    with pytest.raises(DriverError) as raised:
        Settings.from_env(env, Manager.KURED, 60)
    assert str(raised.value).startswith(f"{name} {value!r}, which holds U+")
    assert str(raised.value).endswith(": set it to the Kubernetes name deploy/reboot-gate gives it")


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [("NODE_NAME", "../pods/x", "a Kubernetes object name"),
     ("POD_NAME", "gate?watch=1", "a Kubernetes object name"),
     ("POD_NAMESPACE", "kube-system/pods", "a Kubernetes namespace")],
)  # fmt: skip
def test_a_name_from_the_environment_outside_kubernetes_names_is_refused(
    name: str, value: str, accepted: str
) -> None:
    """They are segments of request paths (the node, the pod and its namespace)."""
    env = {"NODE_NAME": "gpu-1", "POD_NAMESPACE": "gate", "POD_NAME": "pod", name: value}
    with pytest.raises(DriverError) as raised:
        Settings.from_env(env, Manager.KURED, 60)
    assert str(raised.value).startswith(f"{name} {value!r}, which is not {accepted} (")


@pytest.mark.parametrize(
    ("value", "prepull"), [(None, True), ("", True), ("false", False), ("No", False), ("1", True)]
)
def test_the_prepull_setting_is_read_as_every_true_false_setting(
    value: str | None, prepull: bool
) -> None:
    env = {"NODE_NAME": "gpu-1", "POD_NAMESPACE": "gate", "POD_NAME": "pod"}
    if value is not None:
        env[REBOOT_GATE_PREPULL] = value
    assert Settings.from_env(env, Manager.KURED, 60).prepull is prepull


def test_a_misspelt_prepull_setting_is_refused_not_read_as_true() -> None:
    env = {"NODE_NAME": "gpu-1", "POD_NAMESPACE": "gate", "POD_NAME": "pod"}
    with pytest.raises(DriverError, match="invalid value for REBOOT_GATE_PREPULL: 'flase'"):
        Settings.from_env({**env, REBOOT_GATE_PREPULL: "flase"}, Manager.KURED, 60)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("two\nlines", "two\\nlines"),
        ("carriage\rreturn\x1b[31m", "carriage\\rreturn\\x1b[31m"),
        ("bidi\u202eoverride, line\u2028separator", "bidi\\u202eoverride, line\\u2028separator"),
        ("x" * 500, "x" * 399 + "…"),
    ],
)
def test_text_from_the_cluster_reaches_annotations_events_and_logs_as_one_line(
    text: str, line: str
) -> None:
    """The verdict's line (the annotation, the event, the log line) goes through safetext."""
    assert held(text).line == line
    assert allowed(text).line == line
