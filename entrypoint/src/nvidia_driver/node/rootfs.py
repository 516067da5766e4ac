"""The driver root: the container's / made visible to the host at /run/nvidia/driver."""

from __future__ import annotations

from nvidia_driver.commands import Commands
from nvidia_driver.log import say
from nvidia_driver.paths import Paths


def _unescape(field: str) -> str:
    # /proc/mounts escapes spaces and friends as octal.
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")


def is_mounted(paths: Paths) -> bool:
    target = str(paths.driver_root)
    try:
        text = paths.mounts.read_text()
    except OSError:
        return False
    return any(
        len(fields) > 1 and _unescape(fields[1]) == target
        for fields in (line.split() for line in text.splitlines())
    )


def mount_rootfs(paths: Paths, commands: Commands, selinux_enforcing: bool) -> None:
    say("Mounting NVIDIA driver rootfs...")
    # Keep the rbind from recursing into /sys, which the host already has.
    commands.run("mount", "--make-runbindable", paths("/sys"))
    commands.run("mount", "--make-private", paths("/sys"))
    paths.driver_root.mkdir(parents=True, exist_ok=True)
    commands.run("mount", "--rbind", paths.root, paths.driver_root)
    if selinux_enforcing:
        say("Relabeling the driver root's /dev for SELinux...")
        commands.run("chcon", "-R", "-t", "container_file_t", paths.driver_root / "dev")


def unmount_rootfs(paths: Paths, commands: Commands) -> None:
    if not is_mounted(paths):
        return
    say("Unmounting NVIDIA driver rootfs...")
    commands.run("umount", "-l", "-R", paths.driver_root)
