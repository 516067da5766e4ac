from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from flatcar_feed import lts_info_text
from simhost import (
    FLATCAR_OS_RELEASE_UNQUOTED,
    H100,
    SimulatedHost,
    install_stubs,
    process_alive,
)


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
        if process_alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def lts_info(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Flatcar's lts-info as a local file: no unit test reads the network."""
    path = tmp_path_factory.getbasetemp() / "lts-info"
    path.write_text(lts_info_text())
    monkeypatch.setenv("FLATCAR_LTS_INFO_URL", path.as_uri())
    return path
