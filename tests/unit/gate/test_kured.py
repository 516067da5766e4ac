"""The gate as a kured blocker: update_engine asked over D-Bus (fake_dbus.py, a stand-in that
can also forge a reply or leave the bus).

The gate's pod label, held or open, is tested on the real kube-apiserver
(tests/integration/cluster/decisions/test_gate_kured.py); kured's own flow (its
--blocking-pod-selector matching the gate's pod, its lock, its reboot) in test_kured_flow.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import NAMESPACE
from fake_dbus import FakeSystemBus

from nvidia_driver.errors import DriverError
from nvidia_driver.gate.updateengine import read_staged, staged_from_prefs

PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[FakeSystemBus]:
    with FakeSystemBus(tmp_path / "system_bus_socket") as system_bus:
        yield system_bus


def test_update_engine_not_on_the_bus_is_one_line(bus: FakeSystemBus, tmp_path: Path) -> None:
    bus.update_engine = False
    with pytest.raises(DriverError) as caught:
        read_staged(bus.path)
    assert str(caught.value) == (
        "cannot ask update_engine what it staged: GetNameOwner failed: "
        "org.freedesktop.DBus.Error.NameHasNoOwner; the gate's pod needs the host's "
        "/run/dbus/system_bus_socket mounted and uid 500, core's (deploy/reboot-gate/kured)"
    )
    with pytest.raises(DriverError, match=r"^cannot ask update_engine what it staged: .*No such"):
        read_staged(tmp_path / "absent")


def test_update_engine_s_status_says_what_waits_for_a_reboot(bus: FakeSystemBus) -> None:
    assert read_staged(bus.path) == ""
    bus.operation, bus.new_version = "UPDATE_STATUS_DOWNLOADING", "4593.2.5"  # not staged yet
    assert read_staged(bus.path) == ""
    bus.stage("4593.2.5")
    assert read_staged(bus.path) == "4593.2.5"


def test_only_update_engines_own_reply_is_its_answer(bus: FakeSystemBus) -> None:
    """A reply to the same serial from another client is not update_engine's status: only the
    owner of com.coreos.update1 (GetNameOwner) is believed."""
    bus.stage("4593.2.5")
    bus.forge = True
    assert read_staged(bus.path) == "4593.2.5"
    assert [call.member for call in bus.calls] == ["Hello", "GetNameOwner", "GetStatus"]
    assert bus.calls[1].argument == "com.coreos.update1"


def test_update_engines_saved_answer_names_the_release_it_staged(tmp_path: Path) -> None:
    """update_engine saves Omaha's answer at the update check and writes previous-version (the
    release it runs) once the update is applied (flatcar/update_engine omaha_request_action.cc
    TransferComplete, update_attempter.cc ProcessingDone): the answer is always the older file
    while an update waits. An answer naming the running release is an earlier update's."""
    (tmp_path / "full-response").write_text(
        '<response><app><updatecheck status="ok"><manifest version="4593.2.5"></manifest>'
        "</updatecheck></app></response>"
    )
    (tmp_path / "previous-version").write_text("4593.2.4")
    os.utime(tmp_path / "full-response", (1000, 1000))
    os.utime(tmp_path / "previous-version", (1300, 1300))  # the download, then applied
    assert staged_from_prefs(tmp_path) == "4593.2.5"
    (tmp_path / "previous-version").write_text("4593.2.5")
    with pytest.raises(DriverError, match="names the release the node runs"):
        staged_from_prefs(tmp_path)
