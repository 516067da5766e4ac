"""``nvidia-driver status``: what an operator needs at a glance."""

from __future__ import annotations

from collections.abc import Mapping

from nvidia_driver.config import DriverConfig
from nvidia_driver.errors import DriverError
from nvidia_driver.kbuild.pipeline import Pipeline
from nvidia_driver.log import say
from nvidia_driver.node.daemons import IMEX_DRA, DaemonManager, config_value, imex_domain
from nvidia_driver.node.host import read_host_facts
from nvidia_driver.node.kmod import describe_modules
from nvidia_driver.node.lifecycle import Context, node_target
from nvidia_driver.node.moduletype import resolve_module_type
from nvidia_driver.node.peermem import rdma_plan
from nvidia_driver.node.rootfs import is_mounted
from nvidia_driver.paths import FABRICMANAGER_CONFIG, NVLSM_BINARY, NVLSM_CONFIG, Paths
from nvidia_driver.safetext import shown


def _row(label: str, value: str) -> None:
    say(f"{label + ':':<22}{value}")


def _file(paths: Paths, absolute: str) -> str:
    """A host path and whether it exists; shown escaped (a config value may name it)."""
    return f"{shown(absolute)} ({'present' if paths(absolute).exists() else 'missing'})"


def _fabric_rows(paths: Paths) -> None:
    """The fabric manager's and NVLSM's files, and the state files the fabric manager keeps."""
    config = paths(FABRICMANAGER_CONFIG)
    _row("Fabric manager config", _file(paths, FABRICMANAGER_CONFIG))
    for key, label in (("STATE_FILE_NAME", "state file"), ("LOG_FILE_NAME", "log")):
        value = config_value(config, key)
        if value:
            _row(f"Fabric manager {label}", _file(paths, value))
    _row("NVLSM", f"{_file(paths, NVLSM_BINARY)}, config {_file(paths, NVLSM_CONFIG)}")
    domain = imex_domain(paths)
    _row("IMEX domain", f"{len(domain)} node(s)" if domain else f"none configured ({IMEX_DRA})")


def print_status(ctx: Context, env: Mapping[str, str]) -> int:
    facts = read_host_facts(ctx.paths)
    # os-release is the host's file, not the kernel's words: shown escaped.
    host = shown(facts.pretty_name)
    _row("Host", f"{host} (VERSION_ID {shown(facts.version_id) or 'unknown'})")
    _row("Kernel", facts.kernel_release)
    _row("Kernel banner", facts.proc_version)
    gpus = ", ".join(gpu.describe() for gpu in facts.gpus) or "none"
    _row("GPUs", gpus)
    _row("NVSwitches", str(len(facts.nvswitches)))
    if facts.nvlink5_ports:
        _row("NVLink5 ports", ", ".join(facts.nvlink5_ports))
    _row("Lockdown", facts.lockdown or "unknown")
    try:
        config = DriverConfig.from_env(env)
    except DriverError as exc:
        _row("Configuration", f"invalid: {exc}")
        return 1
    _row("Driver", f"{config.driver_version} (branch {config.driver_branch})")
    try:
        choice = resolve_module_type(config.kernel_module_type, config.driver_branch, facts.gpus)
    except DriverError as exc:
        _row("Module type", f"none fits: {exc}")
    else:
        _row("Module type", f"{choice.module_type} ({choice.reason})")
        pipeline = Pipeline(ctx.paths, ctx.commands, config, choice.module_type)
        # MOFED's tree too, as init takes it: a package built without it is not used then.
        target = node_target(facts, rdma_plan(ctx.paths, config, facts).ofa_tree)
        package = pipeline.matching(target, facts.proc_version)
        if package is not None:
            found = f"{package.name} at {package.path}"
        else:  # the reason init's log gives before it builds
            why = pipeline.why_not_precompiled(target, facts.proc_version)
            found = f"none: {why} (init would build one)"
        _row("Precompiled package", found)
    _row("Loaded modules", describe_modules(facts.module_refcounts) or "none")
    daemons = DaemonManager(ctx.paths, ctx.commands, config).running()
    states = (f"{name}: {f'pid {pid}' if pid else 'not running'}" for name, pid in daemons.items())
    _row("Daemons", ", ".join(states))
    _fabric_rows(ctx.paths)
    root = ctx.paths.driver_root
    _row("Driver root", f"{root} ({'mounted' if is_mounted(ctx.paths) else 'not mounted'})")
    return 0
