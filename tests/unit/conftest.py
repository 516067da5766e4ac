from __future__ import annotations

import os
import signal
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from flatcar_feed import lts_info_text
from processes import process_gone
from simhost import (
    FLATCAR_OS_RELEASE_UNQUOTED,
    H100,
    SimulatedHost,
    install_stubs,
)
from tools import add_sbin_to_path, require


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tools(*names): commands the test runs (tools.py)")
    add_sbin_to_path()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked tools(...) fails when one is missing, naming the package (tools.py)."""
    for mark in item.iter_markers("tools"):
        require(*mark.args)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """No unit test is skipped: a green run has run them all. A skip (pytest.skip, skipif) is
    reported as a failure with its reason; expected failures (xfail) stay as they are."""
    report = yield
    if report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped, which the unit suite does not allow: {reason}"
    return report


@pytest.fixture
def host(tmp_path: Path) -> Iterator[SimulatedHost]:
    """A Flatcar node with one H100, its kernel, and the driver's userspace; nothing loaded."""
    simulated = SimulatedHost(tmp_path / "root", tmp_path / "bin", tmp_path / "state")
    simulated.state.mkdir()
    install_stubs(simulated.bin_dir)
    simulated.set_kernel()
    simulated.set_os_release(FLATCAR_OS_RELEASE_UNQUOTED)
    simulated.add_gpus(H100)
    simulated.write("/sys/module/firmware_class/parameters/path", "\n")
    simulated.write("/proc/mounts", "overlay / overlay rw 0 0\n")
    simulated.write(
        "/usr/share/nvidia/nvswitch/fabricmanager.cfg",
        "LOG_LEVEL=4\nFABRIC_MODE=0\n# FABRIC_MODE=2\nDAEMONIZE=1\n",
    )
    simulated.add_driver_sources()
    simulated.add_gsp_firmware()
    yield simulated
    # The stub daemons are real background processes: never leak them.
    for pid in simulated.daemon_pids():
        if not process_gone(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def lts_info(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Flatcar's lts-info as a local file: no unit test reads the network."""
    path = tmp_path_factory.getbasetemp() / "lts-info"
    path.write_text(lts_info_text())
    monkeypatch.setenv("FLATCAR_LTS_INFO_URL", path.as_uri())
    return path
