"""Names and values that try to start a line of their own in a config file or a log line.

modprobe runs an ``install`` line of /etc/modprobe.d as root; the fabric manager reads
``KEY=value`` lines; readers disagree on what breaks a line (``str.splitlines()`` breaks at
``\\r``, ``\\v``, ``\\x85``, ``\\u2028`` ...; modprobe at ``\\n`` alone). Each attack is refused
with one line, and nothing is written: the host's files are exactly as before and no command ran.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from simhost import SimulatedHost

from nvidia_driver.commands import Commands
from nvidia_driver.config import DriverConfig
from nvidia_driver.errors import DriverError
from nvidia_driver.node.daemons import config_value, config_with
from nvidia_driver.node.peermem import reload_nvidia_peermem
from nvidia_driver.paths import Paths

# What str.splitlines() breaks at, besides "\n": each one is a line break to some reader.
LINE_BREAKS = {
    "newline": "\n",
    "carriage-return": "\r",
    "line-separator": "\u2028",
    "paragraph-separator": "\u2029",
    "vertical-tab": "\v",
    "form-feed": "\f",
    "file-separator": "\x1c",
    "group-separator": "\x1d",
    "record-separator": "\x1e",
    "next-line": "\x85",
}
FM_CONFIG = "/usr/share/nvidia/nvswitch/fabricmanager.cfg"


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every file, link and directory under root, with its content: to tell nothing was written."""
    found: dict[str, bytes | str] = {}
    for directory, names, files in os.walk(root):
        for name in names + files:
            path = Path(directory, name)
            key = str(path.relative_to(root))
            if path.is_symlink():
                found[key] = f"-> {path.readlink()}"
            elif path.is_dir():
                found[key] = "directory"
            else:
                found[key] = path.read_bytes()
    return found


def refused_init(host: SimulatedHost, **env: str) -> str:
    """Run init, which must refuse before it writes or runs anything; its one error line."""
    host.add_package("open")
    before = snapshot(host.root)
    result = host.run("init", **env)

    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ERROR: ")
    assert snapshot(host.root) == before, "nothing is written"
    assert host.calls() == [], "no command runs"
    return lines[0]


@pytest.mark.parametrize("line_break", ["\n", "\r", "\u2028"], ids=["newline", "cr", "u2028"])
def test_a_drivers_file_name_with_a_line_break_cannot_add_a_modprobe_install_line(
    host: SimulatedHost, line_break: str
) -> None:
    # A ConfigMap key cannot hold a line break, but /drivers is a plain volume: a hostPath or a
    # CSI volume can. Before, the file's stem became "options <stem> ..." in /etc/modprobe.d.
    name = f"nvidia{line_break}install nvidia sh -c 'id > pwned'; #.conf"
    host.write(f"/drivers/{name}", "NVreg_EnableStreamMemOPs=1\n")

    line = refused_init(host)

    shown = repr(name.removesuffix(".conf"))
    assert line == (
        f"ERROR: /drivers holds a file for the module {shown}, which holds "
        f"U+{ord(line_break):04X}, a line break that would let it start a line of its own where "
        "it is written: name its keys <module>.conf for a module of the driver (nvidia, "
        "nvidia-uvm, nvidia-modeset, nvidia-peermem); fix the kernel module parameters ConfigMap"
    )
    assert not host.path("/etc/modprobe.d").exists()


def test_a_drivers_file_name_of_undecodable_bytes_is_refused(host: SimulatedHost) -> None:
    # A file name that is not UTF-8 reaches Python as lone surrogates, which cannot be written.
    drivers = host.path("/drivers")
    drivers.mkdir()
    (drivers / os.fsdecode(b"nvidia\xff.conf")).write_text("NVreg_EnableStreamMemOPs=1\n")

    line = refused_init(host)

    assert line.startswith("ERROR: /drivers holds a file for the module 'nvidia\\udcff', which ")
    assert "U+DCFF, a control character" in line


def test_a_drivers_file_for_a_module_the_driver_lacks_is_refused(host: SimulatedHost) -> None:
    host.write("/drivers/nvidia-evil.conf", "NVreg_EnableStreamMemOPs=1\n")

    line = refused_init(host)

    assert line.startswith(
        "ERROR: /drivers holds a file for the module 'nvidia-evil', which is not one of the "
        "driver's modules (nvidia, nvidia-uvm, nvidia-modeset, nvidia-peermem): "
    )


@pytest.mark.parametrize(
    "value",
    ["NVreg_RegistryDwords=\x1b]0;owned\x07", "NVreg_X=1\u202e", "NVreg_X=\x00"],
    ids=["terminal-escape", "bidi-override", "nul"],
)
def test_a_module_parameter_with_a_control_character_cannot_reach_modprobe_d(
    host: SimulatedHost, value: str
) -> None:
    host.write("/drivers/nvidia.conf", f"NVreg_EnableStreamMemOPs=1 {value}\n")

    line = refused_init(host)

    assert line.startswith(f"ERROR: /drivers/nvidia.conf holds {value!r}, which holds U+")


def test_a_drivers_file_too_big_to_be_module_parameters_is_refused(host: SimulatedHost) -> None:
    host.write("/drivers/nvidia.conf", "NVreg_EnableStreamMemOPs=1 " * 4096)

    line = refused_init(host)

    assert line == (
        "ERROR: /drivers/nvidia.conf is over 64 KiB: not module parameters; fix the kernel "
        "module parameters ConfigMap"
    )


@pytest.mark.parametrize("line_break", LINE_BREAKS.values(), ids=LINE_BREAKS.keys())
def test_a_line_break_in_an_nvfm_config_value_cannot_add_a_fabric_manager_line(
    host: SimulatedHost, line_break: str
) -> None:
    host.add_nvswitches(4)

    line = refused_init(host, NVFM_CONFIG_LOG_LEVEL=f"4{line_break}FABRIC_MODE=1")

    value = repr(f"4{line_break}FABRIC_MODE=1")
    assert line == (
        f"ERROR: invalid value for NVFM_CONFIG_LOG_LEVEL: the option LOG_LEVEL's value {value}, "
        f"which holds U+{ord(line_break):04X}, a line break that would let it start a line of its "
        "own where it is written: set NVFM_CONFIG_<FIELD>=<value>, FIELD a fabric manager "
        "option, the value on one line"
    )


def test_a_line_break_in_an_nvfm_config_name_is_refused(host: SimulatedHost) -> None:
    host.add_nvswitches(4)

    line = refused_init(host, **{"NVFM_CONFIG_LOG_LEVEL\rFABRIC_MODE": "1"})

    assert line.startswith(
        "ERROR: invalid value for NVFM_CONFIG_LOG_LEVEL\\rFABRIC_MODE: the option name "
        "'LOG_LEVEL\\rFABRIC_MODE', which holds U+000D, a line break"
    )


def test_a_line_break_in_the_driver_config_digest_cannot_reach_run_nvidia(
    host: SimulatedHost,
) -> None:
    line = refused_init(host, DRIVER_CONFIG_DIGEST="abc\u2028Ready")

    assert line.startswith("ERROR: invalid value for DRIVER_CONFIG_DIGEST: 'abc\\u2028Ready', ")


def test_the_fabric_manager_config_reads_back_each_value_as_it_was_set() -> None:
    # The reproducer: "4\rFABRIC_MODE=1" was written, and config_value("FABRIC_MODE") read '1'.
    with pytest.raises(DriverError, match=r"LOG_LEVEL's value '4\\rFABRIC_MODE=1', which holds"):
        config_with("FABRIC_MODE=0\n", {"LOG_LEVEL": "4\rFABRIC_MODE=1"}, "the option", "fix it")


def test_a_written_config_has_one_line_per_setting(tmp_path: Path) -> None:
    config = tmp_path / "fabricmanager.cfg"
    config.write_text(config_with("LOG_LEVEL=4\nFABRIC_MODE=0\n", {"LOG_LEVEL": "1"}, "", ""))

    assert config_value(config, "LOG_LEVEL") == "1"
    assert config_value(config, "FABRIC_MODE") == "0"
    assert config.read_text().splitlines() == ["LOG_LEVEL=1", "FABRIC_MODE=0"]


CONTROL = "holds U+001B, a control character that would let it start a line of its own"


@pytest.mark.parametrize(
    ("node", "problem"),
    [("10.0.0.2\x1b]0;x\x07", f"{CONTROL} where it is written"),
     ("10.0.0.2 X=1", "is not an IP address or host name")],
    ids=["terminal-escape", "not-an-address"],
)  # fmt: skip
def test_an_imex_node_list_cannot_add_an_imex_line(
    host: SimulatedHost, node: str, problem: str
) -> None:
    host.write("/proc/1/root/etc/nvidia-imex/nodes_config.cfg", f"10.0.0.1\n{node}\n")
    host.add_package("open")
    result = host.run("init")

    assert result.returncode == 1
    error = [line for line in result.stderr.splitlines() if line.startswith("ERROR: ")]
    listed = f"/etc/nvidia-imex/nodes_config.cfg lists the node {node!r}"
    assert error == [f"ERROR: {listed}, which {problem}: fix the node's IMEX domain"]
    assert not host.path("/var/run/nvidia-imex/nodes_config.cfg").exists()
    assert not host.path("/var/run/nvidia-imex/config.cfg").exists()


def test_a_peermem_parameter_with_a_control_character_cannot_reach_modprobe_d(
    host: SimulatedHost, capsys: pytest.CaptureFixture[str]
) -> None:
    host.write("/drivers/nvidia-peermem.conf", "peerdirect_support=1\x1b[2J\n")
    host.add_ofa_kernel()
    host.write("/run/mellanox/drivers/.driver-ready", "")
    host.write("/run/nvidia/validations/.driver-ctr-ready", "")
    paths, commands = Paths(host.root), Commands(host.env())
    waited = threading.Event()

    config = DriverConfig.from_env(host.env())
    assert reload_nvidia_peermem(paths, commands, config, sleep=time.sleep, wait=waited.set) == 0

    assert waited.is_set()
    assert not host.calls("chroot")
    assert not host.path("/run/nvidia/driver/etc/modprobe.d").exists()
    [line] = [line for line in capsys.readouterr().err.splitlines() if line]
    assert line.startswith(
        "ERROR: /drivers/nvidia-peermem.conf holds 'peerdirect_support=1\\x1b[2J', which holds "
        "U+001B, a control character"
    )


def test_a_host_root_with_a_line_break_cannot_reach_a_command_line_or_imex_config(
    host: SimulatedHost,
) -> None:
    # Every host path (depmod -b, chroot, IMEX_NODE_CONFIG_FILE=...) is under it.
    line = refused_init(host, NVIDIA_DRIVER_HOST_ROOT=f"{host.root}\nDAEMONIZE=1")

    assert line.startswith(f"ERROR: the host root '{host.root}\\nDAEMONIZE=1', which holds U+000A")
