"""Module parameters and the GSP firmware search path."""

from __future__ import annotations

from nvidia_driver.log import say, warn
from nvidia_driver.paths import DRIVER_ROOT, Paths

# R580+ CDMM: keeps GH200/GB200 GPU memory from showing up as a NUMA node.
COHERENT_MEMORY_PARAM = "NVreg_CoherentGPUMemoryMode=driver"
FIRST_BRANCH_WITH_CDMM = 580
FIRMWARE_SEARCH_PATH = f"{DRIVER_ROOT}/lib/firmware"


def read_params(paths: Paths, module: str) -> list[str]:
    """Parameters from /drivers/<module>.conf: space-separated, over one or more lines."""
    conf = paths.drivers / f"{module}.conf"
    if not conf.is_file():
        return []
    return conf.read_text().split()


def module_params(paths: Paths, branch: int) -> dict[str, list[str]]:
    params = {}
    if paths.drivers.is_dir():
        for conf in sorted(paths.drivers.glob("nvidia*.conf")):
            params[conf.stem] = read_params(paths, conf.stem)
    if branch >= FIRST_BRANCH_WITH_CDMM:
        nvidia = params.setdefault("nvidia", [])
        if not any(param.startswith("NVreg_CoherentGPUMemoryMode=") for param in nvidia):
            nvidia.insert(0, COHERENT_MEMORY_PARAM)
    return params


def write_modprobe_conf(paths: Paths, branch: int) -> dict[str, list[str]]:
    say("Parsing kernel module parameters...")
    params = module_params(paths, branch)
    paths.modprobe_d.mkdir(parents=True, exist_ok=True)
    for module, values in params.items():
        if not values:
            continue
        say(f"Module parameters provided for {module}: {' '.join(values)}")
        conf = paths.modprobe_d / f"{module}.conf"
        say(f"Configuring {module} module parameters in /etc/modprobe.d/{module}.conf")
        conf.write_text(f"options {module} {' '.join(values)}\n")
    return params


def configure_firmware_search_path(paths: Paths, nvidia_params: list[str]) -> None:
    """Let the kernel find the GSP firmware in the driver root.

    The kernel's firmware loader resolves paths in the host's namespace; the container's
    /lib/firmware is the host path /run/nvidia/driver/lib/firmware.
    """
    if "NVreg_EnableGpuFirmware=0" in nvidia_params:
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
    if current:
        warn(f"A search path is already configured in {target}: {current}")
        say("Retaining the current configuration")
        return
    try:
        target.write_text(FIRMWARE_SEARCH_PATH)
    except OSError as exc:
        warn(f"Failed to configure firmware search path: {exc.strerror}")
