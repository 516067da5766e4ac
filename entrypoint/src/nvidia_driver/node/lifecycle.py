"""``init``, ``load`` and ``unload``: the driver's life on a node, as the GPU Operator runs it.

How each of them (and ``build``, node/build.py) starts: the module type the node's GPUs get,
its pipeline, and the node's kernel as the pipeline's target.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nvidia_driver.atomic import write_atomically
from nvidia_driver.commands import Commands
from nvidia_driver.config import DriverConfig
from nvidia_driver.errors import CaughtSignalError, DriverError
from nvidia_driver.kbuild.cachedirs import cache_dir, sweep_stale, work_dir
from nvidia_driver.kbuild.packages import Package, install_package
from nvidia_driver.kbuild.pipeline import Pipeline, RunningKernel, Target
from nvidia_driver.log import say
from nvidia_driver.node.daemons import DaemonManager
from nvidia_driver.node.host import HostFacts, PciDevice, read_host_facts
from nvidia_driver.node.kmod import (
    BUSY_MESSAGE,
    LOAD_ORDER,
    PEERMEM,
    load_host_prerequisites,
    load_modules,
    unload_modules,
)
from nvidia_driver.node.modparams import (
    configure_firmware_search_path,
    module_params,
    provide_gsp_firmware,
    write_modprobe_conf,
)
from nvidia_driver.node.moduletype import resolve_module_type
from nvidia_driver.node.peermem import RdmaPlan, rdma_plan
from nvidia_driver.node.rootfs import mount_rootfs, unmount_rootfs
from nvidia_driver.node.signals import ignore_signals, signals_raise, wait_for_signal
from nvidia_driver.paths import Paths

FLATCAR_DOCS = "https://www.flatcar.org/docs/latest/setup/customization/using-nvidia/"
_LOCK_ATTEMPTS = 10


@dataclass(frozen=True)
class Context:
    paths: Paths
    commands: Commands


class PidLock:
    """The flock on /run/nvidia/nvidia-driver.pid that keeps one driver instance per node.

    The file exists while an instance holds it. Releasing unlinks it while still locked, so an
    instance that opened the file just before and locks it just after holds a file that is no
    longer at the path: acquire() checks that the locked file is the one at the path, and
    starts over if it is not. The path is opened without following a symbolic link.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(_LOCK_ATTEMPTS):
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read_holder(fd)
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise DriverError(
                        "An instance of the NVIDIA driver is already running, aborting "
                        f"(pid {holder} holds {self.path})"
                    ) from exc
                raise DriverError(f"cannot lock {self.path}: {exc.strerror or exc}") from exc
            if self._still_at_path(fd):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                self.fd = fd
                return
            os.close(fd)  # released and unlinked meanwhile: lock the file now at the path
        raise DriverError(
            f"cannot lock {self.path}: it was replaced {_LOCK_ATTEMPTS} times while locking; "
            "is another program rewriting it?"
        )

    def release(self) -> None:
        if self.fd is None:
            return
        # Unlinked while locked: whoever locks the old file next sees it is gone, and retries.
        self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = None

    def _open(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            why = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror or exc
            raise DriverError(
                f"cannot open the lock file {self.path}: {why}; remove it and start again"
            ) from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise DriverError(
                f"the lock file {self.path} is not a regular file; remove it and start again"
            )
        return fd

    def _still_at_path(self, fd: int) -> bool:
        try:
            current = self.path.lstat()
        except FileNotFoundError:
            return False
        locked = os.fstat(fd)
        return (current.st_dev, current.st_ino) == (locked.st_dev, locked.st_ino)


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
    except OSError:
        return "unknown"


def chosen_module_type(config: DriverConfig, gpus: Sequence[PciDevice]) -> str:
    """The module type these GPUs get, said in one line ("auto" without GPUs follows the
    branch)."""
    choice = resolve_module_type(config.kernel_module_type, config.driver_branch, gpus)
    say(f"Using the {choice.module_type} kernel modules ({choice.reason})")
    return choice.module_type


def chosen_pipeline(ctx: Context, config: DriverConfig, gpus: Sequence[PciDevice]) -> Pipeline:
    """The pipeline of that module type: how each subcommand that installs or builds starts."""
    return Pipeline(ctx.paths, ctx.commands, config, chosen_module_type(config, gpus))


def node_target(facts: HostFacts, ofa_kernel: Path | None = None) -> Target:
    """This node's kernel, and MOFED's tree when nvidia-peermem is built against it."""
    running = RunningKernel(facts.proc_version, facts.kernel_release)
    # Another OS's VERSION_ID (ALLOW_NON_FLATCAR: Ubuntu's 24.04) names no Flatcar release.
    return Target(facts.version_id if facts.is_flatcar else "", running, ofa_kernel)


def refuse_unsupported_host(config: DriverConfig, facts: HostFacts) -> None:
    if not facts.is_flatcar and not config.allow_non_flatcar:
        raise DriverError(
            f"this image is for Flatcar Container Linux, but the host is "
            f"{facts.pretty_name or 'unknown'} (ID={facts.os_id or 'unset'} in "
            "/host-etc/os-release); use a driver image for that OS, or set "
            "ALLOW_NON_FLATCAR=true to try anyway"
        )
    if facts.lockdown_active:
        raise DriverError(
            f"Secure Boot lockdown is active (lockdown={facts.lockdown}): the kernel loads only "
            "modules signed by Flatcar's own build key, so modules from a container cannot load; "
            "use Flatcar's signed nvidia-drivers sysexts with the GPU Operator's "
            f"driver.enabled=false ({FLATCAR_DOCS}), or turn Secure Boot off"
        )
    if facts.nouveau_loaded:
        raise DriverError(
            "the nouveau driver is loaded and holds the GPUs: blacklist it on the host "
            "(modprobe.blacklist=nouveau on the kernel command line) and reboot the node"
        )
    if not facts.gpus:
        raise DriverError(
            "No NVIDIA GPU found on this node (no PCI display device of vendor 0x10de): run the "
            "driver DaemonSet only on GPU nodes (label nvidia.com/gpu.present=true)"
        )


@dataclass
class Lifecycle:
    ctx: Context
    config: DriverConfig
    facts: HostFacts
    daemons: DaemonManager = field(init=False)
    lock: PidLock = field(init=False)
    rdma: RdmaPlan = field(init=False)
    params: dict[str, list[str]] = field(init=False, default_factory=dict)  # /drivers, checked
    module_type: str = field(init=False, default="")  # the GPUs' (moduletype.py), checked

    def __post_init__(self) -> None:
        self.daemons = DaemonManager(self.ctx.paths, self.ctx.commands, self.config)
        self.lock = PidLock(self.ctx.paths.pid_file)
        self.rdma = rdma_plan(self.ctx.paths, self.config, self.facts)

    @property
    def paths(self) -> Paths:
        return self.ctx.paths

    @property
    def commands(self) -> Commands:
        return self.ctx.commands

    # -- steps -------------------------------------------------------------------------------

    def set_daemons_status(self, status: str) -> None:
        write_atomically(self.paths.daemons_status, f"{status}\n")

    def modules_to_load(self) -> list[str]:
        """Every module a full install loads, by its /sys/module name."""
        modules = [module.replace("-", "_") for module in LOAD_ORDER]
        return [*modules, PEERMEM.replace("-", "_")] if self.rdma.load_peermem else modules

    def fast_path_applies(self) -> bool:
        """The digest matches and every module a full install would load is loaded.

        Only nvidia.ko loaded (a crash halfway, someone's rmmod) takes the full install: the
        upstream fast path checked nvidia alone (NVIDIA/gpu-operator#2619).
        """
        digest = self.config.driver_config_digest
        if not digest or not self.facts.nvidia_loaded:
            return False
        try:
            if self.paths.state_file.read_text().strip() != digest:
                return False
        except OSError:
            return False
        missing = [m for m in self.modules_to_load() if m not in self.facts.module_refcounts]
        if missing:
            say(
                f"The NVIDIA driver configuration is unchanged, but {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not loaded: performing a full install"
            )
            return False
        return True

    def pipeline(self) -> Pipeline:
        return Pipeline(self.paths, self.commands, self.config, self.module_type)

    def target(self) -> Target:
        return node_target(self.facts, self.rdma.ofa_tree)

    def install(self, package: Package) -> None:
        kernel = self.facts.kernel_release
        install_package(package, self.paths.lib_modules(kernel), self.commands)
        self.commands.run("depmod", "-b", self.paths.root, kernel)

    def load(self, module_type: str) -> None:
        write_modprobe_conf(self.paths, self.params)
        nvidia_params = self.params.get("nvidia", [])
        provide_gsp_firmware(self.paths, self.config.driver_version, module_type, nvidia_params)
        configure_firmware_search_path(self.paths, nvidia_params)
        load_host_prerequisites(self.paths, self.commands)
        if self.rdma.reason:
            say(self.rdma.reason)
        load_modules(self.commands, self.rdma.load_peermem)

    def finish(self) -> None:
        self.daemons.start_all()
        mount_rootfs(self.paths, self.commands, self.facts.selinux_enforcing)
        if self.config.driver_config_digest:
            say("Storing driver configuration digest...")
            write_atomically(self.paths.state_file, self.config.driver_config_digest)
            say(f"Driver configuration digest stored at {self.paths.state_file}")
        self.set_daemons_status("Ready")

    def shutdown(self) -> bool:
        """Stop daemons, unload (unless busy), unmount, release the lock. True if unloaded."""
        self.daemons.stop_all()
        unloaded = True
        try:
            unload_modules(self.paths, self.commands)
        except DriverError as exc:
            if str(exc) != BUSY_MESSAGE:
                raise
            say(BUSY_MESSAGE)
            unloaded = False
        unmount_rootfs(self.paths, self.commands)
        self.lock.release()
        return unloaded

    # -- subcommands -------------------------------------------------------------------------

    def run(self, *, allow_build: bool) -> int:
        say("\n========== NVIDIA Software Installer ==========\n")
        say(
            f"Starting installation of NVIDIA driver version {self.config.driver_version} "
            f"for Linux kernel version {self.facts.kernel_release}"
        )
        refuse_unsupported_host(self.config, self.facts)
        # Every refusal comes before anything changes on the node: once in the try below, a
        # failure unloads the modules, and without k8s-driver-manager (or on a container
        # restart) they are the node's working driver. A module type that does not fit the
        # GPUs, every /drivers name and parameter, and (load compiles nothing) a kernel no
        # package serves are refused here.
        self.module_type = chosen_module_type(self.config, self.facts.gpus)
        self.params = module_params(self.paths, self.config.driver_branch)
        fast = self.fast_path_applies()
        package = None if fast or allow_build else self.existing_package()
        self.lock.acquire()
        # What a killed instance left: none runs now.
        env = self.commands.env
        sweep_stale(cache_dir(self.paths.build_cache, env), work_dir(self.paths.work_cache, env))
        try:
            with signals_raise():
                self.set_daemons_status("NotReady")
                self.install_and_start(fast, package)
                say("Done, now waiting for signal")
                wait_for_signal()
        except CaughtSignalError:
            say("Caught signal")
            ignore_signals()
            self.shutdown()
            return 0
        except BaseException:
            ignore_signals()
            self.cleanup_after_failure()
            raise
        return 0  # pragma: no cover - wait_for_signal only returns by raising

    def existing_package(self) -> Package:
        """The image's or the cache's package for this kernel, or a refusal."""
        package = self.pipeline().package(self.target(), build=False)
        if package is None:
            raise DriverError(
                f"no precompiled package for kernel {self.facts.kernel_release} "
                f"({self.module_type} modules); use 'nvidia-driver init', which builds one"
            )
        return package

    def install_and_start(self, fast: bool, package: Package | None) -> None:
        """package: the one to install, else (init) one found or built after the unload."""
        if fast:
            say(
                "The NVIDIA driver is already loaded with the desired configuration, "
                "performing userspace-only install"
            )
            unmount_rootfs(self.paths, self.commands)
            self.finish()
            say("Userspace-only install complete")
            return
        self.daemons.stop_previous()
        unload_modules(self.paths, self.commands)
        # The digest named the modules just unloaded: until finish() names the new ones, a pod
        # killed meanwhile must not leave k8s-driver-manager (shouldSkipUninstall, v0.12.0) and
        # the fast path trusting it for whatever is loaded then.
        self.paths.state_file.unlink(missing_ok=True)
        unmount_rootfs(self.paths, self.commands)
        if package is None:
            package = self.pipeline().package(self.target())
        self.install(package)
        self.load(package.metadata.module_type)
        self.finish()

    def cleanup_after_failure(self) -> None:
        say("Cleaning up after the failure...")
        try:
            self.shutdown()
        except DriverError as exc:
            say(f"Cleanup incomplete: {exc}")
        finally:
            self.lock.release()


def unload_standalone(ctx: Context, config: DriverConfig) -> int:
    """``nvidia-driver unload``: the shutdown sequence, refused while an instance runs."""
    lifecycle = Lifecycle(ctx, config, read_host_facts(ctx.paths))
    lifecycle.lock.acquire()
    if not lifecycle.shutdown():
        raise DriverError(BUSY_MESSAGE)
    return 0
