"""Choosing between the open and the proprietary kernel modules.

The rules follow nvidia-installer's own (``--print-recommended-kernel-module-type``), which is
not available in the image: self-hosted Grace parts and Blackwell or newer parts require open,
parts without GSP (before Turing) cannot run open, and when both work the branch decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nvidia_driver.errors import DriverError
from nvidia_driver.kbuild.modules import OPEN, PROPRIETARY
from nvidia_driver.node.host import PciDevice

FIRST_BRANCH_PREFERRING_OPEN = 560

# Device-id ranges of the self-hosted Grace Hopper / Grace Blackwell parts (GH100, GB100, GB110).
_OPEN_REQUIRED = ((0x2340, 0x237F), (0x2940, 0x297F), (0x31C0, 0x31FF), (0x31A1, 0x31A1))
# nvidia-installer's heuristic for GPUs without GSP (Maxwell, Pascal, Volta): below Turing's ids.
_NO_GSP = (0x1340, 0x1DFF)
# The proprietary modules load on Blackwell but cannot drive it ("requires use of the NVIDIA open
# kernel modules", RmInitAdapter failed). nvidia-installer 590.48.01 nvGpus.h marks the parts
# they drive GPU_FLAGS_PROPRIETARY_POSSIBLE: none from Blackwell's 0x2900 on (its last is Ada's
# 0x28F8); NVIDIA's "Transitions Fully Towards Open-Source GPU Kernel Modules" (2024-07).
_FIRST_OPEN_ONLY = 0x2900
# NVIDIA's Unix deprecation schedule: "The release 580 series will be the last to support GPUs
# based on the Maxwell, Pascal, and Volta architectures"; nvidia-installer 590.48.01 nvGpus.h
# lists all of 0x1340-0x1DF6 as legacy GPUs of "580.xx".
LAST_BRANCH_FOR_NO_GSP = 580


def requires_open(device: PciDevice) -> str:
    """Why the device requires the open modules; "" if it does not."""
    if any(low <= device.device <= high for low, high in _OPEN_REQUIRED):
        return "self-hosted Grace"
    return "Blackwell or newer" if device.device >= _FIRST_OPEN_ONLY else ""


def lacks_gsp(device: PciDevice) -> bool:
    return device.device < _NO_GSP[0] or _NO_GSP[0] <= device.device <= _NO_GSP[1]


@dataclass(frozen=True)
class ModuleTypeChoice:
    module_type: str
    reason: str


def _names(devices: Sequence[PciDevice]) -> str:
    return ", ".join(device.describe() for device in devices)


def resolve_module_type(requested: str, branch: int, gpus: Sequence[PciDevice]) -> ModuleTypeChoice:
    need_open = [gpu for gpu in gpus if requires_open(gpu)]
    no_open = [gpu for gpu in gpus if lacks_gsp(gpu)]
    if gpus and len(no_open) == len(gpus) and branch > LAST_BRANCH_FOR_NO_GSP:
        raise DriverError(
            f"driver branch {branch} does not support {_names(no_open)}: GPUs without GSP "
            f"(Maxwell, Pascal, Volta) are legacy GPUs of branch {LAST_BRANCH_FOR_NO_GSP}; "
            f"run a {LAST_BRANCH_FOR_NO_GSP} driver on this node"
        )
    if need_open and no_open:
        raise DriverError(
            f"no kernel module type fits this node: {_names(need_open)} require open modules and "
            f"{_names(no_open)} cannot use them; run these GPUs on separate nodes"
        )
    if requested == OPEN:
        if no_open:
            raise DriverError(
                f"KERNEL_MODULE_TYPE=open, but {_names(no_open)} predate Turing and have no GSP; "
                "set KERNEL_MODULE_TYPE=proprietary or auto"
            )
        return ModuleTypeChoice(OPEN, "requested by KERNEL_MODULE_TYPE")
    if requested == PROPRIETARY:
        if need_open:
            raise DriverError(
                f"KERNEL_MODULE_TYPE=proprietary, but {_names(need_open)} require open modules; "
                "set KERNEL_MODULE_TYPE=open or auto"
            )
        return ModuleTypeChoice(PROPRIETARY, "requested by KERNEL_MODULE_TYPE")
    if need_open:
        kinds = ", ".join(sorted({requires_open(gpu) for gpu in need_open}))
        return ModuleTypeChoice(OPEN, f"auto: {_names(need_open)} ({kinds}) require open modules")
    if no_open:
        return ModuleTypeChoice(
            PROPRIETARY, f"auto: {_names(no_open)} predate Turing (no GSP), open is ruled out"
        )
    if branch < FIRST_BRANCH_PREFERRING_OPEN:
        return ModuleTypeChoice(
            PROPRIETARY, f"auto: branch {branch} is older than 560 and prefers proprietary modules"
        )
    return ModuleTypeChoice(OPEN, f"auto: branch {branch} with Turing or newer GPUs uses open")
