"""Module parameters, and the GSP firmware: its files and the kernel's search path for them."""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

from nvidia_driver.atomic import DEFAULT_MODE, replacing, write_atomically
from nvidia_driver.errors import DriverError
from nvidia_driver.kbuild.modules import OPEN
from nvidia_driver.limits import MODULE_PARAMETERS, size
from nvidia_driver.log import say, warn
from nvidia_driver.node.kmod import MODULES
from nvidia_driver.paths import DRIVER_ROOT, FIRMWARE_DIR, IMAGE_FIRMWARE_DIR, Paths
from nvidia_driver.safetext import module_name, module_parameter, shown

# R580+ CDMM: keeps GH200/GB200 GPU memory from showing up as a NUMA node.
COHERENT_MEMORY_PARAM = "NVreg_CoherentGPUMemoryMode=driver"
FIRST_BRANCH_WITH_CDMM = 580
FIRMWARE_SEARCH_PATH = f"{DRIVER_ROOT}/lib/firmware"
FIRMWARE_DISABLED = "NVreg_EnableGpuFirmware=0"
# The kernel module parameters ConfigMap (driver.kernelModuleConfig) is mounted at /drivers, a
# key per module; a hostPath or CSI volume there can hold any file name.
PARAMETERS_FIX = "only name=value tokens are accepted; fix the kernel module parameters ConfigMap"
MODULE_FIX = (
    f"name its keys <module>.conf for a module of the driver ({', '.join(MODULES)}); fix the "
    "kernel module parameters ConfigMap"
)


def read_params(paths: Paths, module: str) -> list[str]:
    """Parameters from /drivers/<module>.conf: ``name=value``, space-separated, over lines.

    Anything else is refused (safetext.py): the tokens become an ``options`` line, never
    modprobe arguments (``-C other.conf`` would make modprobe run that file's install commands),
    and no token may break that line.
    """
    conf = paths.drivers / f"{module}.conf"
    if not conf.is_file():
        return []
    with conf.open("rb") as file:
        data = file.read(MODULE_PARAMETERS + 1)
    if len(data) > MODULE_PARAMETERS:
        raise DriverError(
            f"/drivers/{module}.conf is over {size(MODULE_PARAMETERS)}: not module parameters; "
            "fix the kernel module parameters ConfigMap"
        )
    where = f"/drivers/{module}.conf holds"
    return [
        module_parameter(token, where, PARAMETERS_FIX)
        for token in data.decode(errors="replace").split()
    ]


def options_line(module: str, values: list[str]) -> str:
    return f"options {module} {' '.join(values)}\n"


def module_params(paths: Paths, branch: int) -> dict[str, list[str]]:
    """Every module's parameters, each name and token checked (safetext.py) before any is used."""
    say("Parsing kernel module parameters...")
    params = {}
    if paths.drivers.is_dir():
        for conf in sorted(paths.drivers.glob("nvidia*.conf")):
            module = module_name(
                conf.stem, MODULES, "/drivers holds a file for the module", MODULE_FIX
            )
            params[module] = read_params(paths, module)
    if branch >= FIRST_BRANCH_WITH_CDMM:
        nvidia = params.setdefault("nvidia", [])
        if not any(param.startswith("NVreg_CoherentGPUMemoryMode=") for param in nvidia):
            nvidia.insert(0, COHERENT_MEMORY_PARAM)
    return params


def write_modprobe_conf(paths: Paths, params: dict[str, list[str]]) -> None:
    """/etc/modprobe.d/<module>.conf for every module with parameters (of module_params)."""
    for module, values in params.items():
        if not values:
            continue
        say(f"Module parameters provided for {module}: {' '.join(values)}")
        say(f"Configuring {module} module parameters in /etc/modprobe.d/{module}.conf")
        write_atomically(paths.modprobe_d / f"{module}.conf", options_line(module, values))


def configure_firmware_search_path(paths: Paths, nvidia_params: list[str]) -> None:
    """Let the kernel find the GSP firmware in the driver root.

    The kernel's firmware loader resolves paths in the host's namespace; the container's
    /lib/firmware is the host path /run/nvidia/driver/lib/firmware.
    """
    if FIRMWARE_DISABLED in nvidia_params:
        return
    target = paths.firmware_search_path
    say(
        f"Configuring the following firmware search path in '/{target.relative_to(paths.root)}"
        f"': {FIRMWARE_SEARCH_PATH}"
    )
    try:
        current = target.read_text().strip()
    except OSError:
        current = ""
    if current == FIRMWARE_SEARCH_PATH:  # a module parameter: set by an earlier pod this boot
        return
    if current:
        warn(f"A search path is already configured in {target}: {shown(current)}")
        say("Retaining the current configuration")
        return
    try:
        target.write_text(FIRMWARE_SEARCH_PATH)
    except OSError as exc:
        warn(f"Failed to configure firmware search path: {exc.strerror}")


def provide_gsp_firmware(
    paths: Paths, driver_version: str, module_type: str, nvidia_params: list[str]
) -> None:
    """Copy the image's GSP firmware into /lib/firmware/nvidia/<version>, where nvidia.ko asks.

    The Operator mounts the host path /run/nvidia/driver/lib/firmware over /lib/firmware, which
    hides anything the image put there; so the image keeps it under /opt/lib/firmware.
    """
    if FIRMWARE_DISABLED in nvidia_params:
        return
    source = paths.image_firmware(driver_version)
    files = sorted(path for path in source.glob("*") if path.is_file())
    if not files:
        where = f"{IMAGE_FIRMWARE_DIR}/{driver_version}"
        if module_type == OPEN:
            raise DriverError(
                f"no GSP firmware for driver {driver_version} in {where}, which the open kernel "
                "modules need: the image is incomplete; rebuild it with this project's "
                "Dockerfiles, whose userspace installer puts the firmware there"
            )
        warn(
            f"the image has no GSP firmware for driver {driver_version} in {where}: the "
            "proprietary modules load without GSP, and GPUs that need it will fail (set "
            f"{FIRMWARE_DISABLED} in nvidia.conf if that is intended)"
        )
        return
    destination = paths.firmware(driver_version)
    stale = [file for file in files if not _same_content(file, destination / file.name)]
    if not stale:
        return
    say(f"Copying the GSP firmware into {FIRMWARE_DIR}/{driver_version}...")
    try:
        for file in stale:
            # The kernel may read it at any time: it sees the old file or the new one, never half.
            with replacing(destination / file.name) as staged:
                shutil.copyfile(file, staged)
                staged.chmod(DEFAULT_MODE)
    except OSError as exc:
        raise DriverError(
            f"copying the GSP firmware into {FIRMWARE_DIR}/{driver_version} failed "
            f"({exc.strerror}): the host path {FIRMWARE_SEARCH_PATH} must be writable"
        ) from exc


def _same_content(source: Path, copy: Path) -> bool:
    try:
        return filecmp.cmp(source, copy, shallow=False)
    except FileNotFoundError:
        return False
