"""``nvidia-driver reboot-gate``: the gate's parts, made from the pod's environment (which
variables, and who sets them: settings.py, ``nvidia-driver settings``)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from nvidia_driver.commands import Commands
from nvidia_driver.formats.oci import token_hosts
from nvidia_driver.gate.buildcheck import BuildImage
from nvidia_driver.gate.gate import Gate, Settings
from nvidia_driver.gate.kubeapi import KubeAPI, namespace
from nvidia_driver.gate.managers import Manager
from nvidia_driver.gate.prepull import PrePull
from nvidia_driver.gate.registry import Registry
from nvidia_driver.gate.verdict import Checker, Releases
from nvidia_driver.kbuild.cachedirs import cache_dir, work_dir
from nvidia_driver.kbuild.release import FlatcarReleases
from nvidia_driver.log import say
from nvidia_driver.settings import DRIVER_VERSION, GPU_OPERATOR_NAMESPACE
from nvidia_driver.sources.download import feed_downloader
from nvidia_driver.sources.flatcar import releases_url_from_env

# An emptyDir in the gate's pod: a kernel banner (cache), the vmlinuz it came from (work).
CACHE = Path("/var/cache/nvidia-reboot-gate/cache")
WORK = Path("/var/cache/nvidia-reboot-gate/work")
OPERATOR_NAMESPACE = "gpu-operator"


def make_gate(
    env: Mapping[str, str], manager: Manager, interval: float, *, others: bool = False
) -> Gate:
    settings = Settings.from_env(env, manager, interval, others=others)
    api = KubeAPI.from_env(env)
    commands = Commands(dict(env))
    releases = FlatcarReleases.from_env(commands, cache_dir(CACHE, env), work_dir(WORK, env), env)
    checker = Checker(
        api,
        Releases(releases_url_from_env(env), feed_downloader(env)),
        BuildImage(env.get(DRIVER_VERSION, "").strip(), commands, releases),
        operator_namespace=namespace(
            env.get(GPU_OPERATOR_NAMESPACE, "").strip() or OPERATOR_NAMESPACE,
            GPU_OPERATOR_NAMESPACE,
            "set it to the namespace the GPU Operator runs in",
        ),
        registry=Registry(token_hosts=token_hosts(env)),
    )
    # The --others Deployment judges no node's own reboot: nothing of its own to pull.
    on_node = settings.prepull and not settings.others
    prepull = PrePull(api, settings.namespace, settings.node_name) if on_node else None
    return Gate(settings, api, checker, prepull)


def reboot_gate(
    env: Mapping[str, str], manager: str, interval: float, *, once: bool, others: bool = False
) -> int:
    gate = make_gate(env, Manager(manager), interval, others=others)
    if once:
        verdict = gate.look()
        say(verdict.text if verdict else "Nothing to decide: no reboot is being asked for")
        return 0
    stop = threading.Event()

    def stopping(signum: int, frame: FrameType | None) -> None:
        del frame
        say(f"Caught signal {signum}: the reboot gate stops")
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stopping)
    gate.run(stop)
    return 0
