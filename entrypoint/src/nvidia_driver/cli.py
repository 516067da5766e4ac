"""Command line of ``nvidia-driver``.

Only argparse is imported up front: ``--help`` must stay fast, and each subcommand imports
what it needs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

DISTRIBUTION = "nvidia-driver-entrypoint"  # entrypoint/pyproject.toml
SUBCOMMANDS = {
    "init": "install the driver for this node, start its daemons and wait (default)",
    "build": "compile and package the kernel modules without loading them",
    "load": "install a matching precompiled package and load it (no compile)",
    "unload": "stop the daemons, unload the modules and unmount the driver root",
    "status": "show the host, the module type, packages, modules and daemons",
    "reload_nvidia_peermem": "load nvidia-peermem once MOFED and the driver are ready (sidecar)",
    "probe_nvidia_peermem": "probe that nvidia-peermem is loaded when MOFED is (sidecar probe)",
    "reboot-gate": "hold a Flatcar reboot until the driver image of the staged release exists",
    "settings": "list the environment variables the image reads: defaults, who sets them",
}


INIT_OPTIONS = "-a/--accept-license and -m/--max-threads N"
OWN_COMMANDS = ("reboot-gate", "settings")  # this project's, not NVIDIA's init's


class OneLineParser(argparse.ArgumentParser):
    """Refuses what it cannot parse in one line (exit 1), not argparse's usage and exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"ERROR: {self.prog}: {message}; see {self.prog} --help", file=sys.stderr,
              flush=True)  # fmt: skip
        raise SystemExit(1)


def package_version() -> str:
    """The installed distribution's version, else the package's own.

    The images copy the package without its metadata; the two are the same version
    (entrypoint/pyproject.toml reads it from ``nvidia_driver.__version__``).
    """
    from importlib import metadata  # noqa: PLC0415 - only for --version: keeps --help fast

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        from nvidia_driver import __version__  # noqa: PLC0415

        return __version__


class VersionAction(argparse.Action):
    """``--version``: the version is looked up only when it is asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print the version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        print(f"{parser.prog} {package_version()}", flush=True)
        parser.exit()


def parser() -> argparse.ArgumentParser:
    main = OneLineParser(
        prog="nvidia-driver",
        description="NVIDIA GPU driver container entrypoint for Flatcar Container Linux, "
        "as run by the NVIDIA GPU Operator.",
        epilog="Configuration comes from the environment, most of it set by the GPU Operator: "
        "nvidia-driver settings lists every variable.",
    )
    main.add_argument("--version", action=VersionAction)
    main.add_argument(
        "--host-root",
        metavar="DIR",
        help="resolve every host path (/proc, /sys, /run/nvidia, ...) under DIR "
        "(default: $NVIDIA_DRIVER_HOST_ROOT or /)",
    )
    commands = main.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name, help_text in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if name == "init":
            # What NVIDIA's init accepts (getopt -l accept-license,max-threads: -o am:), which
            # the NVIDIADriver resource's spec.args appends after "init".
            sub.add_argument(
                "-a", "--accept-license", action="store_true",
                help="accepted and ignored: NVIDIA's license is accepted when the image is built",
            )  # fmt: skip
            sub.add_argument(
                "-m", "--max-threads", type=_positive, metavar="N",
                help="parallel compile jobs of a runtime build (as MAX_THREADS)",
            )  # fmt: skip
        if name == "build":
            sub.add_argument(
                "--flatcar-version",
                metavar="V",
                help="build for this Flatcar release instead of the running one (several: "
                "space- or comma-separated, one package each, side by side in --output)",
            )
            sub.add_argument(
                "--module-type",
                choices=("auto", "open", "proprietary"),
                help="override KERNEL_MODULE_TYPE",
            )
            sub.add_argument(
                "--output", type=Path, metavar="DIR", help="also copy the package into DIR"
            )
        if name == "reboot-gate":
            _gate_options(sub)
        if name == "settings":
            sub.add_argument(
                "--markdown", action="store_true", help="as the table of docs/settings.md"
            )
    return main


def _gate_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--manager", choices=("fluo", "kured"), required=True,
        help="the reboot manager: FLUO (a before-reboot hook) or kured (a blocking pod)",
    )  # fmt: skip
    sub.add_argument(
        "--interval", type=_seconds, default=60.0, metavar="SECONDS",
        help="how often to look again while a reboot is held (default 60)",
    )  # fmt: skip
    sub.add_argument("--once", action="store_true", help="decide once, print it and exit")
    sub.add_argument(
        "--others", action="store_true",
        help="FLUO: approve the nodes no gate pod judges (without GPUs, or without a driver "
        "from the GPU Operator) instead of this node: the Deployment's mode",
    )  # fmt: skip


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 1 <= value <= 86400:  # noqa: PLR2004 - a day
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from 1 to 86400")
    return value


def _positive(text: str) -> int:
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of jobs")
    return int(text)


def _init_options(args: argparse.Namespace, env: dict[str, str]) -> None:
    """Apply the options NVIDIA's init accepts; say what each means here."""
    from nvidia_driver.log import say  # noqa: PLC0415 - keeps --help fast

    if getattr(args, "accept_license", False):
        say(
            "Ignoring --accept-license: NVIDIA's license was accepted when this image was "
            "built; nothing is installed with nvidia-installer on the node"
        )
    threads = getattr(args, "max_threads", None)
    if threads is not None:
        say(f"Using {threads} parallel compile jobs for a runtime build (--max-threads)")
        from nvidia_driver.settings import MAX_THREADS  # noqa: PLC0415

        env[MAX_THREADS] = str(threads)


def reboot_gate(args: argparse.Namespace) -> int:
    from nvidia_driver.gate.main import reboot_gate  # noqa: PLC0415 - keeps --help fast

    return reboot_gate(
        dict(os.environ), args.manager, args.interval, once=args.once, others=args.others
    )


def settings(args: argparse.Namespace) -> int:
    from nvidia_driver.settings import markdown, text  # noqa: PLC0415 - keeps --help fast

    print(markdown() if args.markdown else text(), end="", flush=True)
    return 0


def dispatch(args: argparse.Namespace) -> int:
    from nvidia_driver.commands import Commands  # noqa: PLC0415 - keeps --help fast
    from nvidia_driver.config import DriverConfig  # noqa: PLC0415
    from nvidia_driver.node.lifecycle import Context  # noqa: PLC0415
    from nvidia_driver.paths import Paths  # noqa: PLC0415

    env = dict(os.environ)
    _init_options(args, env)
    ctx = Context(Paths.from_env(args.host_root, env), Commands(env))
    command = args.command or "init"
    if command == "status":
        from nvidia_driver.node.status import print_status  # noqa: PLC0415

        return print_status(ctx, env)
    if command == "probe_nvidia_peermem":
        from nvidia_driver.node.peermem import probe_nvidia_peermem  # noqa: PLC0415

        return probe_nvidia_peermem(ctx.paths, DriverConfig.from_env(env, require_version=False))
    config = DriverConfig.from_env(env)
    if command == "reload_nvidia_peermem":
        from nvidia_driver.node.peermem import reload_nvidia_peermem  # noqa: PLC0415

        return reload_nvidia_peermem(ctx.paths, ctx.commands, config)
    if command == "build":
        from nvidia_driver.node.build import build_command  # noqa: PLC0415

        versions = (args.flatcar_version or "").replace(",", " ").split()
        for version in versions or [None]:
            build_command(
                ctx,
                config,
                module_type=args.module_type,
                flatcar_version=version,
                output=args.output,
            )
        return 0
    from nvidia_driver.node import lifecycle  # noqa: PLC0415
    from nvidia_driver.node.host import read_host_facts  # noqa: PLC0415

    if command == "unload":
        return lifecycle.unload_standalone(ctx, config)
    facts = read_host_facts(ctx.paths)
    return lifecycle.Lifecycle(ctx, config, facts).run(allow_build=command == "init")


def main(argv: Sequence[str] | None = None) -> int:
    args, unknown = parser().parse_known_args(argv)
    if unknown and args.command in OWN_COMMANDS:  # not the Operator's: no spec.args to blame
        print(f"ERROR: nvidia-driver {args.command} does not accept {' '.join(unknown)}; see "
              f"nvidia-driver {args.command} --help", file=sys.stderr, flush=True)  # fmt: skip
        return 1
    if unknown and args.command is None:
        # gpu-operator controllers/object_controls.go: driverContainer.Args = config.Driver.Args
        given = ", ".join(f'"{arg}"' for arg in unknown)
        print(f"ERROR: nvidia-driver was given {' '.join(unknown)} before any subcommand: a "
              "ClusterPolicy's driver.args replace the Operator's [\"init\"], so give them "
              f'after it, as ["init", {given}]', file=sys.stderr, flush=True)  # fmt: skip
        return 1
    if unknown:
        command = args.command
        accepted = f"it accepts {INIT_OPTIONS}" if command == "init" else "it takes no options"
        print(f"ERROR: nvidia-driver {command} does not accept {' '.join(unknown)}: "
              f"{accepted}, as NVIDIA's driver container does; remove it from the "
              "NVIDIADriver's spec.args", file=sys.stderr, flush=True)  # fmt: skip
        return 1
    from nvidia_driver.errors import DriverError  # noqa: PLC0415

    try:
        run = {"reboot-gate": reboot_gate, "settings": settings}.get(args.command, dispatch)
        return run(args)
    except DriverError as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
