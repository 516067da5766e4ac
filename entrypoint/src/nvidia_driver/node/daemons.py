"""The persistence daemon, the fabric manager (NVSwitch and NVLink5 systems) and IMEX.

NVLink5 (B200, GB200): as NVIDIA's image, init waits for mlx5_core and ib_umad and runs the
fabric manager's own start script, which starts NVLSM from /opt/nvidia/nvlsm/sbin/nvlsm and
then the fabric manager (NVIDIA/gpu-driver-container ubuntu24.04/nvidia-driver,
``_start_daemons``). Older NVSwitch systems run nv-fabricmanager itself.

IMEX: NVIDIA's image installs nvidia-imex but never starts it (the NVIDIA DRA driver's
ComputeDomains run it from the driver root). Here it is started only on a node configured
for an IMEX domain: one whose /etc/nvidia-imex/nodes_config.cfg lists the domain's addresses
(the IMEX_NODE_CONFIG_FILE of NVIDIA's default config); otherwise one line says why not.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nvidia_driver.atomic import write_atomically
from nvidia_driver.commands import Commands
from nvidia_driver.config import DriverConfig
from nvidia_driver.errors import DriverError
from nvidia_driver.links import resolve_within
from nvidia_driver.log import say
from nvidia_driver.node.host import is_loaded, nvlink5_ports, nvswitch_devices
from nvidia_driver.paths import (
    FABRICMANAGER_CONFIG,
    IMEX_CONFIG,
    NVLSM_BINARY,
    NVLSM_CONFIG,
    Paths,
)
from nvidia_driver.safetext import ADDRESS, check_name, config_entry

STOP_TIMEOUT_SECONDS = 5.0
NVLINK5_MODULES = ("mlx5_core", "ib_umad")


@dataclass(frozen=True)
class Daemon:
    name: str
    pid_file: str
    program: str


PERSISTENCED = Daemon(
    "persistence", "/var/run/nvidia-persistenced/nvidia-persistenced.pid", "nvidia-persistenced"
)
FABRICMANAGER = Daemon(
    "fabric manager", "/var/run/nvidia-fabricmanager/nv-fabricmanager.pid", "nv-fabricmanager"
)
NVLSM = Daemon("NVLink subnet manager", "/var/run/nvidia-fabricmanager/nvlsm.pid", "nvlsm")
IMEX = Daemon("IMEX", "/var/run/nvidia-imex/nvidia-imex.pid", "nvidia-imex")
# The kernel keeps the first 15 bytes of the name a process executed (TASK_COMM_LEN).
_COMM_LENGTH = 15
# Stopped in this order, as NVIDIA's scripts do (IMEX, which needs the fabric, first).
ALL_DAEMONS = (IMEX, PERSISTENCED, FABRICMANAGER, NVLSM)
# The config and domain IMEX is started with, and its output.
IMEX_RUN_CONFIG = "/var/run/nvidia-imex/config.cfg"
IMEX_NODES = "/var/run/nvidia-imex/nodes_config.cfg"
IMEX_LOG = "/var/log/nvidia-imex.log"
IMEX_DRA = "the NVIDIA DRA driver's ComputeDomains run nvidia-imex from the driver root"


def read_pid(paths: Paths, daemon: Daemon) -> int | None:
    try:
        text = paths(daemon.pid_file).read_text().strip()
    except OSError:
        return None
    return int(text) if re.fullmatch(r"[0-9]{1,10}", text) else None


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited; only its parent has yet to reap it.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def runs_program(pid: int, program: str) -> bool:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    return comm == program[:_COMM_LENGTH]


def config_with(text: str, overrides: dict[str, str], what: str, fix: str) -> str:
    """``KEY=value`` lines of a daemon's config with overrides applied (rewritten or appended).

    Each override must be one line of the config: all are checked (safetext.py) first.
    """
    pending = dict(config_entry(key, value, what, fix) for key, value in overrides.items())
    lines = text.splitlines()
    for index, line in enumerate(lines):
        key = line.split("=", 1)[0].strip()
        if "=" in line and not line.lstrip().startswith("#") and key in pending:
            lines[index] = f"{key}={pending.pop(key)}"
    lines.extend(f"{key}={value}" for key, value in pending.items())
    return "\n".join(lines) + "\n"


def config_value(path: Path, key: str) -> str | None:
    """A ``KEY=value`` field of a daemon's config file; None if unset or unreadable."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and not line.lstrip().startswith("#") and name.strip() == key:
            return value.strip()
    return None


def configure_fabricmanager(paths: Paths, overrides: dict[str, str]) -> None:
    """Apply NVFM_CONFIG_<FIELD>=value to fabricmanager.cfg: rewrite the field or append it."""
    if not overrides:
        return
    config = paths(FABRICMANAGER_CONFIG)
    text = config.read_text() if config.is_file() else ""
    updated = config_with(text, overrides, "the fabric manager option", "fix NVFM_CONFIG_*")
    for key, value in overrides.items():
        say(f"Setting fabric manager option {key}={value}")
    write_atomically(config, updated)


def imex_domain(paths: Paths) -> list[str]:
    """The addresses the node's nodes_config.cfg lists for its IMEX domain."""
    # The node's links, as the node resolves them (an absolute one would leave /proc/1/root).
    nodes = resolve_within(paths.host_filesystem, paths.host_imex_nodes)
    try:
        text = nodes.read_text(errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip()[:1] not in ("", "#")]


def _wait_for_modules(
    paths: Paths, modules: tuple[str, ...], timeout: float, sleep: Callable[[float], None]
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        missing = [module for module in modules if not is_loaded(paths, module)]
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise DriverError(
                f"NVLink5 system, but {', '.join(missing)} not loaded after {timeout:g} s: "
                "the fabric manager needs them; load them on the host (or deploy the "
                "network operator) and restart the driver pod"
            )
        say(f"waiting for the {' and '.join(modules)} kernel modules to be loaded")
        sleep(5)


@dataclass
class DaemonManager:
    paths: Paths
    commands: Commands
    config: DriverConfig
    module_wait_seconds: float = 600.0
    sleep: Callable[[float], None] = time.sleep

    def start_all(self) -> None:
        say("Starting NVIDIA persistence daemon...")
        self.commands.run(PERSISTENCED.program, "--persistence-mode")
        self.start_fabricmanager()
        self.start_imex()

    def start_imex(self) -> None:
        if self.commands.which(IMEX.program) is None:
            # Two reasons, told apart only at image build: NVIDIA's redist has no IMEX for the
            # driver, or versions.toml records no digest for it, so the build left it out.
            say("Skipping NVIDIA IMEX daemon: this image has no nvidia-imex (NVIDIA's redist "
                "lists no IMEX for this driver, or versions.toml records no IMEX digest and the "
                "image build left it out)")  # fmt: skip
            return
        domain = imex_domain(self.paths)
        if not domain:
            say(
                "Skipping NVIDIA IMEX daemon: the node lists no IMEX domain in "
                f"/etc/nvidia-imex/nodes_config.cfg ({IMEX_DRA}; NVIDIA's driver container "
                "does not start it either)"
            )
            return
        for address in domain:  # each a line of IMEX's own nodes_config.cfg
            check_name(address, ADDRESS, "/etc/nvidia-imex/nodes_config.cfg lists the node",
                       "an IP address or host name", "fix the node's IMEX domain")  # fmt: skip
        say(f"Starting NVIDIA IMEX daemon for a domain of {len(domain)} node(s)...")
        nodes = self.paths(IMEX_NODES)
        write_atomically(nodes, "\n".join(domain) + "\n")
        image_config = self.paths(IMEX_CONFIG)
        text = image_config.read_text() if image_config.is_file() else ""
        # In the foreground, so that init knows its pid and stops it with the others.
        config = self.paths(IMEX_RUN_CONFIG)
        settings = {"DAEMONIZE": "0", "IMEX_NODE_CONFIG_FILE": str(nodes)}
        fix = "run the driver container with a host root whose path is one line"
        write_atomically(config, config_with(text, settings, "the IMEX option", fix))
        pid = self.commands.spawn(IMEX.program, "-c", config, log=self.paths(IMEX_LOG))
        write_atomically(self.paths(IMEX.pid_file), f"{pid}\n")

    def start_fabricmanager(self) -> None:
        # Both proc entries appear only once nvidia.ko is loaded, so they are read now.
        ports = nvlink5_ports(self.paths)
        if ports:
            say(f"Detected NVLink5+ system (management ports: {', '.join(ports)})")
            if not self.paths(NVLSM_BINARY).exists():
                # The start script would abort on it; an image built without NVLSM's recorded
                # digest leaves it out (sources/redist.py), so say which image this is and what
                # to do.
                raise DriverError(
                    f"this is an NVLink5 node (ports {', '.join(ports)}) and this image has no "
                    f"NVLSM ({NVLSM_BINARY}), without which the fabric manager cannot start: "
                    "use an image built with NVLSM (`invoke record-driver "
                    f"{self.config.driver_version}` records its SHA-256 from NVIDIA's files in "
                    "versions.toml; or pass invoke build --redist-sha256 nvlsm.<arch>=<sha256>)"
                )
            _wait_for_modules(self.paths, NVLINK5_MODULES, self.module_wait_seconds, self.sleep)
            configure_fabricmanager(self.paths, self.config.fabricmanager_overrides)
            say("Starting NVIDIA fabric manager daemon for NVLink5+...")
            self.commands.run(
                "nvidia-fabricmanager-start.sh",
                "--mode",
                "start",
                "--fm-config-file",
                self.paths(FABRICMANAGER_CONFIG),
                "--fm-pid-file",
                self.paths(FABRICMANAGER.pid_file),
                "--nvlsm-config-file",
                self.paths(NVLSM_CONFIG),
                "--nvlsm-pid-file",
                self.paths(NVLSM.pid_file),
            )
            if self.config.fabricmanager_overrides.get("FABRIC_MODE") == "1":
                say("Resetting GPUs to clear stale fabric partition states...")
                self.commands.run("nvidia-smi", "-r")
            return
        switches = nvswitch_devices(self.paths)
        if switches:
            say(f"Detected {len(switches)} NVSwitch device(s)")
            configure_fabricmanager(self.paths, self.config.fabricmanager_overrides)
            say("Starting NVIDIA fabric manager daemon...")
            self.commands.run(FABRICMANAGER.program, "-c", self.paths(FABRICMANAGER_CONFIG))
            return
        say("No NVSwitch devices found, skipping NVIDIA fabric manager daemon")

    def stop_previous(self) -> None:
        """Stop the daemons a previous instance left running, before a full install.

        The fabric manager's pid files are on a host path (the Operator mounts
        /run/nvidia-fabricmanager; Debian's /var/run is /run): a pod killed without its
        shutdown leaves them, and under hostPID their pid may since be any process of the node.
        A pid file whose process does not run the daemon's program is only removed.
        """
        for daemon in ALL_DAEMONS:
            pid = read_pid(self.paths, daemon)
            if pid is not None and not runs_program(pid, daemon.program):
                say(f"Removing the stale pid file of the NVIDIA {daemon.name} daemon: pid {pid} "
                    f"is not {daemon.program}")  # fmt: skip
                self.paths(daemon.pid_file).unlink(missing_ok=True)
        self.stop_all()

    def stop_all(self) -> list[str]:
        """Stop every daemon that has a pid file; return the names of those that would not stop."""
        stubborn = []
        for daemon in ALL_DAEMONS:
            pid = read_pid(self.paths, daemon)
            if pid is None:
                continue
            say(f"Stopping NVIDIA {daemon.name} daemon...")
            if not self._stop(pid):
                say(f"Could not stop NVIDIA {daemon.name} daemon")
                stubborn.append(daemon.name)
                continue
            self.paths(daemon.pid_file).unlink(missing_ok=True)
        return stubborn

    def _stop(self, pid: int) -> bool:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if not is_running(pid):
                return True
            time.sleep(0.1)
        return not is_running(pid)

    def running(self) -> dict[str, int | None]:
        status: dict[str, int | None] = {}
        for daemon in ALL_DAEMONS:
            pid = read_pid(self.paths, daemon)
            status[daemon.name] = pid if pid is not None and is_running(pid) else None
        return status
