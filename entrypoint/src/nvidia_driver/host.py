"""Facts about the host, read from files under the root (see paths.py)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from nvidia_driver.errors import DriverError
from nvidia_driver.paths import Paths

NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)  # VGA controller, 3D controller
NVSWITCH_CLASS = 0x0680  # "other bridge"
MELLANOX_VENDOR = 0x15B3
_MAX_SYMLINKS = 40


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def resolve_within(root: Path, path: Path) -> Path:
    """Resolve ``path`` (under ``root``) following symlinks as if ``root`` were ``/``.

    Flatcar's /etc/os-release is a relative symlink (../usr/lib/os-release); seen from a
    container, an absolute or relative target must still land inside the host's tree.
    """
    current = path
    for _ in range(_MAX_SYMLINKS):
        if not current.is_symlink():
            return current
        target = Path(current.readlink())
        if target.is_absolute():
            current = root / target.relative_to("/")
        else:
            parts: list[str] = list(current.parent.relative_to(root).parts)
            for part in target.parts:
                if part == "..":
                    if parts:
                        parts.pop()
                elif part != ".":
                    parts.append(part)
            current = root.joinpath(*parts)
    raise DriverError(f"too many levels of symbolic links at {path}")


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

    @property
    def is_nvswitch(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and (self.pci_class >> 8) == NVSWITCH_CLASS

    def describe(self) -> str:
        return f"{self.address} [{self.vendor:04x}:{self.device:04x}]"


def _hex(path: Path) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text.strip(), 16)
    except ValueError:
        return None


def read_pci_devices(paths: Paths) -> list[PciDevice]:
    devices: list[PciDevice] = []
    base = paths.pci_devices
    if not base.is_dir():
        return devices
    for entry in sorted(base.iterdir()):
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
        text = _read(resolve_within(root, path)) if path.exists() or path.is_symlink() else None
        if text is not None:
            return parse_os_release(text)
    return {}


def read_lockdown(paths: Paths) -> str:
    """The active lockdown mode: none, integrity or confidentiality ("" if unknown)."""
    text = _read(paths.lockdown)
    if not text:
        return ""
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return ""


def module_refcounts(paths: Paths) -> dict[str, int]:
    counts: dict[str, int] = {}
    base = paths.sys_module
    if not base.is_dir():
        return counts
    for refcnt in sorted(base.glob("*/refcnt")):
        text = _read(refcnt)
        if text is not None and text.strip().lstrip("-").isdigit():
            counts[refcnt.parent.name] = int(text.strip())
    return counts


def is_loaded(paths: Paths, module: str) -> bool:
    return (paths.sys_module / module.replace("-", "_") / "refcnt").is_file()


def nvswitch_devices(paths: Paths) -> list[str]:
    base = paths.nvswitch_devices
    if not base.is_dir():
        return []
    return sorted(entry.name for entry in base.iterdir())


def nvlink5_ports(paths: Paths) -> list[str]:
    """InfiniBand devices whose VPD marks them as NVLink5 switch management ports."""
    ports: list[str] = []
    base = paths.infiniband
    if not base.is_dir():
        return ports
    for device in sorted(base.iterdir()):
        try:
            vpd = (device / "device" / "vpd").read_bytes()
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


def read_host_facts(paths: Paths) -> HostFacts:
    banner = (_read(paths.proc_version) or "").split("\n", 1)[0]
    release = (_read(paths.kernel_osrelease) or "").strip()
    if not release and banner.startswith("Linux version "):
        release = banner.split()[2]
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
        selinux_enforcing=(_read(paths.selinux_enforce) or "").strip() == "1",
    )
