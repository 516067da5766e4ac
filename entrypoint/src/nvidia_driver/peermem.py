"""The ``nvidia-peermem-ctr`` sidecar: ``reload_nvidia_peermem`` and ``probe_nvidia_peermem``."""

from __future__ import annotations

import time
from collections.abc import Callable

from nvidia_driver.commands import Commands
from nvidia_driver.config import DriverConfig
from nvidia_driver.errors import CaughtSignalError, DriverError
from nvidia_driver.host import is_loaded
from nvidia_driver.lifecycle import signals_raise, wait_for_signal
from nvidia_driver.log import say
from nvidia_driver.modparams import read_params
from nvidia_driver.paths import Paths

POLL_SECONDS = 10.0


def _ready(paths: Paths, config: DriverConfig) -> bool:
    if config.use_host_mofed:
        mofed_ready = is_loaded(paths, "mlx5_core")
    else:
        mofed_ready = paths.mellanox_ready.exists()
    return mofed_ready and paths.driver_ctr_ready.exists()


def reload_nvidia_peermem(
    paths: Paths,
    commands: Commands,
    config: DriverConfig,
    sleep: Callable[[float], None] = time.sleep,
    wait: Callable[[], None] = wait_for_signal,
) -> int:
    while not _ready(paths, config):
        say("waiting for mellanox ofed and nvidia drivers to be installed")
        sleep(POLL_SECONDS)
    params = read_params(paths, "nvidia-peermem")
    if is_loaded(paths, "nvidia_peermem"):
        say("nvidia-peermem module already loaded, skipping modprobe")
    else:
        # The driver root holds the modules the main container installed.
        result = commands.run(
            "chroot", paths.driver_root, "modprobe", "nvidia-peermem", *params, check=False
        )
        if result.returncode != 0:
            raise DriverError(
                f"failed to load nvidia-peermem module: {result.stderr.strip() or 'no output'}"
            )
        say("successfully loaded nvidia-peermem module, now waiting for signal")
    try:
        with signals_raise():
            wait()
    except CaughtSignalError:  # any signal ends the sidecar cleanly
        return 0
    return 0


def probe_nvidia_peermem(paths: Paths) -> int:
    if not is_loaded(paths, "mlx5_core"):
        say("MOFED drivers are not ready, skipping probe to avoid container restarts...")
        return 0
    if not is_loaded(paths, "nvidia_peermem"):
        say("nvidia-peermem module is not loaded")
        return 1
    return 0
