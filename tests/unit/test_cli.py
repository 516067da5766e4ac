"""The command line: help, status, and the peermem sidecar commands."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from importlib import metadata

import pytest
from simhost import FLATCAR_OS_RELEASE_UNQUOTED, SimulatedHost
from tools import python_m

import nvidia_driver
from nvidia_driver import cli
from nvidia_driver.commands import Commands
from nvidia_driver.config import DriverConfig
from nvidia_driver.node.peermem import reload_nvidia_peermem
from nvidia_driver.paths import FABRICMANAGER_CONFIG, Paths
from nvidia_driver.safetext import unsafe
from nvidia_driver.settings import DRIVER_VERSION, SETTINGS


def test_help_lists_every_subcommand() -> None:
    output = python_m("nvidia_driver", "--help")
    for command in cli.SUBCOMMANDS:
        assert command in output


def test_help_imports_nothing_heavy() -> None:
    # --help must start fast: the subcommand modules are imported only when they run.
    code = (
        "import sys; from nvidia_driver import cli\n"
        "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('nvidia_driver')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip().splitlines()[-1] == "['nvidia_driver', 'nvidia_driver.cli']"


def test_version_is_the_packages() -> None:
    output = python_m("nvidia_driver", "--version")
    # The tests run against the installed package: its metadata and its code say the same.
    assert metadata.version(cli.DISTRIBUTION) == nvidia_driver.__version__
    assert output == f"nvidia-driver {nvidia_driver.__version__}\n"


def test_version_without_package_metadata(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The images copy the package into dist-packages, without its metadata.
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"nvidia-driver {nvidia_driver.__version__}\n"


def test_status_reads_at_a_glance(host: SimulatedHost) -> None:
    host.add_package("open")
    host.set_module("nvidia", 2)
    host.set_module("nvidia_uvm", 0)
    result = host.run("status")
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(":", 1) for line in result.stdout.splitlines())
    assert lines["Host"].strip().startswith("Flatcar Container Linux by Kinvolk 4593.2.0")
    assert lines["Kernel"].strip() == "6.12.81-flatcar"
    assert lines["Module type"].strip().startswith("open (auto: branch 580")
    assert lines["Precompiled package"].strip().startswith("nvidia-modules-6.12.81 at ")
    assert lines["Loaded modules"].strip() == "nvidia (refcnt 2), nvidia_uvm (refcnt 0)"
    assert "persistence: not running" in lines["Daemons"]
    assert lines["Driver root"].strip().endswith("(not mounted)")


def test_status_shows_the_host_s_files_escaped_on_their_lines(host: SimulatedHost) -> None:
    """os-release and the fabric manager's config are the host's files: a terminal escape or a
    bidirectional override in them is shown escaped, never sent to the operator's terminal."""
    host.set_os_release(FLATCAR_OS_RELEASE_UNQUOTED.replace(
        '(Oklo)"', '(Oklo)\x1b[2J\u202eForged"'))  # fmt: skip
    host.write(FABRICMANAGER_CONFIG, "LOG_FILE_NAME=/var/log/fm\x1b]0;title\x07.log\n")
    result = host.run("status")
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stdout.splitlines() if unsafe(line)] == []
    lines = dict(line.split(":", 1) for line in result.stdout.splitlines())
    assert lines["Host"].strip() == (
        "Flatcar Container Linux by Kinvolk 4593.2.0 (Oklo)\\x1b[2J\\u202eForged "
        "(VERSION_ID 4593.2.0)"
    )
    assert lines["Fabric manager log"].strip() == "/var/log/fm\\x1b]0;title\\x07.log (missing)"


def test_status_without_driver_version_still_shows_the_host(host: SimulatedHost) -> None:
    result = host.run("status", DRIVER_VERSION="")
    assert result.returncode == 1
    assert "Kernel:" in result.stdout
    assert "missing DRIVER_VERSION" in result.stdout


def test_build_module_type_auto_overrides_kernel_module_type(
    host: SimulatedHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--module-type auto chooses by the GPUs and branch, as its help says, whatever
    KERNEL_MODULE_TYPE is (in-process: SimulatedHost.run would run the installed copy)."""
    host.add_host_kernel_tree()
    for name, value in host.env(KERNEL_MODULE_TYPE="proprietary").items():
        monkeypatch.setenv(name, value)
    output = host.root.parent / "out"
    assert cli.main(["build", "--module-type", "auto", "--output", str(output)]) == 0
    assert "Using the open kernel modules (auto: branch 580" in capsys.readouterr().out
    assert [path.name for path in output.iterdir()] == ["open"]


def test_the_commands_said_to_run_without_driver_version_do(
    host: SimulatedHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DRIVER_VERSION's row in nvidia-driver settings (and docs/settings.md) names the commands
    it is not required by: each of them succeeds without it (in-process: SimulatedHost.run
    would run the installed copy)."""
    meaning = SETTINGS[DRIVER_VERSION].meaning
    [named] = re.findall(r"required but by ([a-z_ ,]+)", meaning)
    exempt = re.split(r",? and |, ", named.strip())
    assert exempt
    for name, value in host.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(DRIVER_VERSION, raising=False)
    for command in exempt:
        assert cli.main([command]) == 0, command


def test_probe_peermem(host: SimulatedHost) -> None:
    result = host.run("probe_nvidia_peermem")
    assert result.returncode == 0
    assert "MOFED drivers are not ready, skipping probe" in result.stdout
    host.set_module("mlx5_core")  # the kernel's inbox driver, without MOFED
    result = host.run("probe_nvidia_peermem")
    assert result.returncode == 0, "no MOFED tree: nvidia-peermem is not expected"
    assert "use DMA-BUF instead" in result.stdout
    host.add_ofa_kernel()
    result = host.run("probe_nvidia_peermem")
    assert result.returncode == 1
    assert "nvidia-peermem module is not loaded" in result.stdout
    host.set_module("nvidia_peermem")
    assert host.run("probe_nvidia_peermem").returncode == 0


def _sidecar(host: SimulatedHost) -> tuple[Paths, Commands, DriverConfig]:
    return Paths(host.root), Commands(host.env()), DriverConfig.from_env(host.env())


def _ready(host: SimulatedHost) -> None:
    host.write("/run/mellanox/drivers/.driver-ready", "")
    host.write("/run/nvidia/validations/.driver-ctr-ready", "")


def test_reload_peermem_waits_for_mofed_and_the_driver(host: SimulatedHost) -> None:
    host.write("/drivers/nvidia-peermem.conf", "peerdirect_support=1\n")
    host.add_ofa_kernel()
    paths, commands, config = _sidecar(host)
    polls: list[float] = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 2:
            _ready(host)

    waited = threading.Event()
    assert reload_nvidia_peermem(paths, commands, config, sleep=sleep, wait=waited.set) == 0
    assert polls == [10.0, 10.0]
    assert waited.is_set()
    # The module's parameters are an options line, never modprobe arguments.
    assert host.calls("chroot") == [
        f"chroot {host.path('/run/nvidia/driver')} modprobe nvidia-peermem"
    ]
    conf = host.path("/run/nvidia/driver/etc/modprobe.d/nvidia-peermem.conf")
    assert conf.read_text() == "options nvidia-peermem peerdirect_support=1\n"
    # Loaded already: no second modprobe.
    assert reload_nvidia_peermem(paths, commands, config, sleep=sleep, wait=waited.set) == 0
    assert len(host.calls("chroot")) == 1


def test_peermem_options_cannot_become_modprobe_arguments(
    host: SimulatedHost, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 10 item 3: "-C evil.conf" made modprobe run that file's install line as root."""
    host.write("/tmp/evil.conf", "install nvidia-peermem /bin/sh -c 'touch /tmp/owned'\n")
    host.write("/drivers/nvidia-peermem.conf", "peerdirect_support=1 -C /tmp/evil.conf\n")
    host.add_ofa_kernel()
    _ready(host)
    waited = threading.Event()
    assert reload_nvidia_peermem(*_sidecar(host), sleep=time.sleep, wait=waited.set) == 0
    assert waited.is_set(), "the sidecar waits instead of exiting: it never crash-loops"
    assert not host.calls("chroot")
    assert not host.path("/run/nvidia/driver/etc/modprobe.d/nvidia-peermem.conf").exists()
    [line] = [line for line in capsys.readouterr().err.splitlines() if line]
    assert line.startswith("ERROR: /drivers/nvidia-peermem.conf holds '-C', which is not a module")


def test_without_mofed_the_sidecar_points_to_dma_buf_and_waits(
    host: SimulatedHost, capsys: pytest.CaptureFixture[str]
) -> None:
    _ready(host)
    waited = threading.Event()
    assert reload_nvidia_peermem(*_sidecar(host), sleep=time.sleep, wait=waited.set) == 0
    assert waited.is_set()
    assert not host.calls("chroot")
    out = capsys.readouterr().out
    assert "/run/mellanox/drivers/usr/src/ofa_kernel is absent" in out
    assert "use DMA-BUF instead (the open kernel modules with the kernel's inbox RDMA" in out


def test_a_failed_modprobe_is_one_line_and_no_exit(
    host: SimulatedHost, capsys: pytest.CaptureFixture[str]
) -> None:
    host.add_ofa_kernel()
    _ready(host)
    host.fail("chroot", "modprobe: ERROR: could not insert 'nvidia_peermem': Invalid argument")
    waited = threading.Event()
    assert reload_nvidia_peermem(*_sidecar(host), sleep=time.sleep, wait=waited.set) == 0
    assert waited.is_set()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "failed to load nvidia-peermem: modprobe: ERROR" in err[0]


def test_the_sidecar_ends_cleanly_on_sigterm(host: SimulatedHost) -> None:
    _ready(host)
    sidecar = host.start("reload_nvidia_peermem")
    sidecar.wait_for("use DMA-BUF instead")
    assert sidecar.terminate() == 0
    assert "Caught signal" in sidecar.output


def test_reload_peermem_with_host_mofed_waits_for_mlx5(host: SimulatedHost) -> None:
    host.write("/run/nvidia/validations/.driver-ctr-ready", "")
    host.set_module("mlx5_core")
    config = DriverConfig.from_env(host.env(USE_HOST_MOFED="true"))

    def poll(seconds: float) -> None:
        pytest.fail(f"polled for {seconds} s: mlx5_core is loaded, so the sidecar is ready")

    code = reload_nvidia_peermem(
        Paths(host.root), Commands(host.env()), config, sleep=poll, wait=lambda: None
    )
    assert code == 0


def test_options_without_a_subcommand_say_to_put_init_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A ClusterPolicy's driver.args replace the Operator's ["init"] (gpu-operator
    controllers/object_controls.go): ["--accept-license"] runs nvidia-driver --accept-license,
    which was refused as an option init "does not accept" while naming it as accepted."""
    assert cli.main(["--accept-license"]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == (
        "ERROR: nvidia-driver was given --accept-license before any subcommand: a "
        "ClusterPolicy's driver.args replace the Operator's [\"init\"], so give them after it, "
        'as ["init", "--accept-license"]'
    )
