"""Facts about the host, read from files under the root (see paths.py)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from nvidia_driver.errors import DriverError
from nvidia_driver.links import resolve_within
from nvidia_driver.naming import banner_release
from nvidia_driver.paths import Paths

NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)  # VGA controller, 3D controller
MELLANOX_VENDOR = 0x15B3
_MAX_FACT_BYTES = 1 << 20  # os-release, /proc and /sys files are a few KiB at most
_ABSENT = (FileNotFoundError, NotADirectoryError, IsADirectoryError)
_HEX = re.compile(r"(0x)?[0-9a-fA-F]+")
_COUNT = re.compile(r"-?[0-9]+")


def _unreadable(path: Path, exc: OSError) -> DriverError:
    return DriverError(
        f"cannot read {path}: {exc.strerror or exc}; the driver container must run privileged, "
        "with the host's PID namespace (hostPID) and its /proc and /sys"
    )


def _read(path: Path) -> str | None:
    """A host file's text (at most _MAX_FACT_BYTES); None if there is no such file."""
    try:
        with path.open("rb") as file:
            return file.read(_MAX_FACT_BYTES).decode(errors="replace")
    except _ABSENT:
        return None
    except OSError as exc:
        raise _unreadable(path, exc) from None


def _entries(directory: Path) -> list[Path]:
    """A host directory's entries, sorted; none if there is no such directory."""
    try:
        return sorted(directory.iterdir())
    except _ABSENT:
        return []
    except OSError as exc:
        raise _unreadable(directory, exc) from None


def parse_os_release(text: str) -> dict[str, str]:
    """Parse os-release, quoted (Flatcar >= 4628) or unquoted (older releases)."""
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        try:
            words = shlex.split(line, comments=False, posix=True)
        except ValueError:
            continue
        if len(words) == 1 and "=" in words[0]:
            key, value = words[0].split("=", 1)
            values[key] = value
    return values


@dataclass(frozen=True)
class PciDevice:
    address: str
    vendor: int
    device: int
    pci_class: int

    @property
    def is_gpu(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and (self.pci_class >> 8) in GPU_CLASSES

    def describe(self) -> str:
        return f"{self.address} [{self.vendor:04x}:{self.device:04x}]"


def _hex(path: Path) -> int | None:
    text = _read(path)
    if text is None or not _HEX.fullmatch(text.strip()):
        return None
    return int(text.strip(), 16)


def read_pci_devices(paths: Paths) -> list[PciDevice]:
    devices: list[PciDevice] = []
    for entry in _entries(paths.pci_devices):
        vendor, device, pci_class = (
            _hex(entry / "vendor"),
            _hex(entry / "device"),
            _hex(entry / "class"),
        )
        if vendor is None or device is None or pci_class is None:
            continue
        devices.append(PciDevice(entry.name, vendor, device, pci_class))
    return devices


def read_os_release(paths: Paths) -> dict[str, str]:
    # The Operator mounts the host's /etc/os-release at /host-etc/os-release; with hostPID the
    # host's own tree under /proc/1/root is the fallback.
    for root, path in (
        (paths.root, paths.host_os_release),
        (paths.host_filesystem, paths.host_filesystem / "etc/os-release"),
    ):
        text = _read(resolve_within(root, path))
        if text is not None:
            return parse_os_release(text)
    return {}


def _read_host_sys(paths: Paths, path: Path) -> str | None:
    """A file of a filesystem the host mounts under /sys (securityfs, selinuxfs).

    The runtime mounts the container a fresh sysfs without them (tigera/operator PR 4992;
    NVIDIA/gpu-driver-container 2957a8b): with hostPID, the host's is read through /proc/1/root
    when the container has none.
    """
    return _read(path) or _read(paths.host_filesystem / path.relative_to(paths.root))


def read_lockdown(paths: Paths) -> str:
    """The active lockdown mode: none, integrity or confidentiality ("" if unknown)."""
    words = (_read_host_sys(paths, paths.lockdown) or "").split()
    return next((word[1:-1] for word in words if word.startswith("[") and word.endswith("]")), "")


def module_refcounts(paths: Paths) -> dict[str, int]:
    counts: dict[str, int] = {}
    for module in _entries(paths.sys_module):
        text = _read(module / "refcnt")
        if text is not None and _COUNT.fullmatch(text.strip()):
            counts[module.name] = int(text.strip())
    return counts


def is_loaded(paths: Paths, module: str) -> bool:
    refcnt = paths.sys_module / module.replace("-", "_") / "refcnt"
    try:
        return refcnt.is_file()
    except OSError as exc:
        raise _unreadable(refcnt, exc) from None


def nvswitch_devices(paths: Paths) -> list[str]:
    return [entry.name for entry in _entries(paths.nvswitch_devices)]


def nvlink5_ports(paths: Paths) -> list[str]:
    """InfiniBand devices whose VPD marks them as NVLink5 switch management ports."""
    ports: list[str] = []
    for device in _entries(paths.infiniband):
        try:
            with (device / "device" / "vpd").open("rb") as file:
                vpd = file.read(_MAX_FACT_BYTES)
        except OSError:
            continue
        if b"SW_MNG" in vpd:
            ports.append(device.name)
    return ports


@dataclass(frozen=True)
class HostFacts:
    os_release: dict[str, str]
    kernel_release: str
    proc_version: str
    pci_devices: list[PciDevice] = field(default_factory=list)
    nvswitches: list[str] = field(default_factory=list)
    nvlink5_ports: list[str] = field(default_factory=list)
    lockdown: str = ""
    module_refcounts: dict[str, int] = field(default_factory=dict)
    selinux_enforcing: bool = False

    @property
    def os_id(self) -> str:
        return self.os_release.get("ID", "")

    @property
    def version_id(self) -> str:
        return self.os_release.get("VERSION_ID", "")

    @property
    def is_flatcar(self) -> bool:
        return self.os_id == "flatcar"

    @property
    def gpus(self) -> list[PciDevice]:
        return [device for device in self.pci_devices if device.is_gpu]

    @property
    def mellanox_present(self) -> bool:
        return any(device.vendor == MELLANOX_VENDOR for device in self.pci_devices)

    @property
    def lockdown_active(self) -> bool:
        return self.lockdown not in ("", "none")

    @property
    def nouveau_loaded(self) -> bool:
        return "nouveau" in self.module_refcounts

    @property
    def nvidia_loaded(self) -> bool:
        return "nvidia" in self.module_refcounts

    @property
    def pretty_name(self) -> str:
        return self.os_release.get("PRETTY_NAME") or f"{self.os_id} {self.version_id}".strip()


def _banner(paths: Paths) -> str:
    return (_read(paths.proc_version) or "").split("\n", 1)[0]


def running_release(paths: Paths) -> str:
    """uname -r: the kernel's osrelease, else the release its banner names; "" for neither."""
    release = (_read(paths.kernel_osrelease) or "").strip()
    if release:
        return release
    try:
        return banner_release(_banner(paths))
    except DriverError:
        return ""


def read_host_facts(paths: Paths) -> HostFacts:
    banner = _banner(paths)
    release = running_release(paths)
    if not banner or not release:
        raise DriverError(
            f"cannot read the kernel version from {paths.proc_version}: "
            "is /proc mounted in the container?"
        )
    return HostFacts(
        os_release=read_os_release(paths),
        kernel_release=release,
        proc_version=banner,
        pci_devices=read_pci_devices(paths),
        nvswitches=nvswitch_devices(paths),
        nvlink5_ports=nvlink5_ports(paths),
        lockdown=read_lockdown(paths),
        module_refcounts=module_refcounts(paths),
        selinux_enforcing=(_read_host_sys(paths, paths.selinux_enforce) or "").strip() == "1",
    )
