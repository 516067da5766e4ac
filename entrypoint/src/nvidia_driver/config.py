"""The driver configuration, read once from the environment the GPU Operator sets."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from nvidia_driver import naming
from nvidia_driver.errors import DriverError
from nvidia_driver.safetext import check, config_entry, shown
from nvidia_driver.settings import (
    ALLOW_NON_FLATCAR,
    DRIVER_BRANCH,
    DRIVER_CONFIG_DIGEST,
    DRIVER_VERSION,
    GPU_DIRECT_RDMA_ENABLED,
    KERNEL_MODULE_TYPE,
    MAX_THREADS,
    NVFM_CONFIG_,
    OPEN_KERNEL_MODULES_ENABLED,
    TARGETARCH,
    USE_HOST_MOFED,
)

MODULE_TYPES = ("auto", "open", "proprietary")
_NUMBER = re.compile(r"[0-9]+")
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def _invalid(variable: str, value: str, accepted: str) -> DriverError:
    return DriverError(f"invalid value for {variable}: {value!r} (accepted: {accepted})")


def flag(env: Mapping[str, str], variable: str, *, default: bool = False) -> bool:
    """A true/false setting; unset or empty, default."""
    value = env.get(variable, "").strip().lower()
    if not value:
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise _invalid(variable, env[variable], "true, false")


def _module_type(env: Mapping[str, str]) -> str:
    requested = env.get(KERNEL_MODULE_TYPE, "").strip().lower()
    if requested:
        if requested not in MODULE_TYPES:
            raise _invalid(KERNEL_MODULE_TYPE, env[KERNEL_MODULE_TYPE], ", ".join(MODULE_TYPES))
        return requested
    # Kept by the Operator for backwards compatibility: it means "open".
    return "open" if flag(env, OPEN_KERNEL_MODULES_ENABLED) else "auto"


def _driver_version(env: Mapping[str, str], *, required: bool) -> str:
    version = env.get(DRIVER_VERSION, "").strip()
    if not version:
        if required:
            raise DriverError(
                "missing DRIVER_VERSION: the image sets it; run an image built by this project "
                "or set DRIVER_VERSION to the driver version the image carries"
            )
        return ""
    if not naming.DRIVER_VERSION_RE.fullmatch(version):
        raise _invalid(DRIVER_VERSION, version, "a driver version such as 580.105.08")
    return version


def _driver_branch(env: Mapping[str, str], version: str) -> int:
    raw = env.get(DRIVER_BRANCH, "").strip()
    derived = str(naming.driver_branch(version)) if version else ""
    if not raw:
        return int(derived) if derived else 0
    if not _NUMBER.fullmatch(raw):
        raise _invalid(DRIVER_BRANCH, raw, "the driver's major version, such as 580")
    if derived and raw != derived:
        raise _invalid(DRIVER_BRANCH, raw, f"{derived}, the branch of DRIVER_VERSION {version}")
    return int(raw)


def _target_arch(env: Mapping[str, str]) -> str:
    raw = env.get(TARGETARCH, "").strip()
    if not raw:
        return naming.machine_arch()
    if raw not in naming.ARCHES:
        raise _invalid(TARGETARCH, raw, ", ".join(naming.ARCHES))
    return raw


def _fabricmanager_overrides(env: Mapping[str, str]) -> dict[str, str]:
    """NVFM_CONFIG_<FIELD>=value: each a line of fabricmanager.cfg, so checked as one (safetext)."""
    overrides = {}
    fix = "set NVFM_CONFIG_<FIELD>=<value>, FIELD a fabric manager option, the value on one line"
    for key, value in sorted(env.items()):
        if key.startswith(NVFM_CONFIG_) and len(key) > len(NVFM_CONFIG_):
            what = f"invalid value for {shown(key)}: the option"  # the name is not checked yet
            field_name, checked = config_entry(key[len(NVFM_CONFIG_) :], value, what, fix)
            overrides[field_name] = checked
    return overrides


def _digest(env: Mapping[str, str]) -> str:
    # Written to /run/nvidia/nvidia-driver.state and logged.
    digest = env.get(DRIVER_CONFIG_DIGEST, "").strip()
    fix = "set it to the GPU Operator's digest, on one line"
    return check(digest, "invalid value for DRIVER_CONFIG_DIGEST:", fix)


@dataclass(frozen=True)
class DriverConfig:
    driver_version: str
    driver_branch: int
    target_arch: str
    kernel_module_type: str = "auto"
    driver_config_digest: str = ""
    gpu_direct_rdma: bool = False
    use_host_mofed: bool = False
    fabricmanager_overrides: dict[str, str] = field(default_factory=dict)
    allow_non_flatcar: bool = False
    max_threads: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, require_version: bool = True) -> DriverConfig:
        version = _driver_version(env, required=require_version)
        threads = env.get(MAX_THREADS, "").strip()
        if threads and not _NUMBER.fullmatch(threads):
            raise _invalid(MAX_THREADS, threads, "a positive number of parallel compile jobs")
        return cls(
            driver_version=version,
            driver_branch=_driver_branch(env, version),
            target_arch=_target_arch(env),
            kernel_module_type=_module_type(env),
            driver_config_digest=_digest(env),
            gpu_direct_rdma=flag(env, GPU_DIRECT_RDMA_ENABLED),
            use_host_mofed=flag(env, USE_HOST_MOFED),
            fabricmanager_overrides=_fabricmanager_overrides(env),
            allow_non_flatcar=flag(env, ALLOW_NON_FLATCAR),
            max_threads=int(threads) if threads else 0,
        )
