"""Packaging details of the runtime build: debug info stripping and the module sources digest."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest
from simhost import BANNER, DRIVER, KERNEL, SimulatedHost
from synthetic_patch import synthetic_patch
from tools import needs

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.kbuild import build
from nvidia_driver.kbuild.build import module_sources_digest, strip_debug_info
from nvidia_driver.kbuild.compiler import CHROOT_PATH, Toolchain, choose_compiler, kernel_config
from nvidia_driver.kbuild.kerneltree import HOST, KernelTree


def test_strip_runs_in_the_developer_container_like_the_compiler(
    host: SimulatedHost, tmp_path: Path
) -> None:
    root = tmp_path / "devcontainer"
    host_strip = root / "usr/bin/strip"
    host_strip.parent.mkdir(parents=True)
    host_strip.touch()
    workdir = root / "var/tmp/.build.x"
    files = [workdir / "nvidia.ko", workdir / "nvidia/nv-interface.o"]
    assert strip_debug_info(files, Commands(host.env()), Toolchain(root))
    [call] = host.calls("chroot")
    assert call == (
        f"chroot {root} /usr/bin/env PATH={CHROOT_PATH} strip --strip-debug "
        "/var/tmp/.build.x/nvidia.ko /var/tmp/.build.x/nvidia/nv-interface.o"
    )


def test_without_strip_the_modules_keep_their_debug_info(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "devcontainer"  # a developer container without binutils
    assert not strip_debug_info([root / "nvidia.ko"], Commands({"PATH": ""}), Toolchain(root))
    assert capsys.readouterr().out == (
        f"WARNING: no strip in the developer container at {root}: packaging the modules with "
        "their debug info\n"
    )


@needs("gcc", "strip", "readelf", "nm")
def test_stripping_keeps_what_loading_and_relinking_need(tmp_path: Path) -> None:
    source = tmp_path / "interface.c"
    source.write_text(
        "extern int core(int);\nstatic int twice(int x) { return 2 * x; }\n"
        "int interface(int x) { return core(twice(x)); }\n"
    )
    commands = Commands()
    obj = tmp_path / "interface.o"
    commands.run("gcc", "-g", "-O0", "-c", source, "-o", obj)
    symbols = commands.run("nm", obj).stdout
    relocations = _relocations_against("core", obj, commands)
    assert relocations
    assert ".debug_info" in commands.run("readelf", "-SW", obj).stdout

    assert strip_debug_info([obj], commands)
    assert ".debug_" not in commands.run("readelf", "-SW", obj).stdout
    assert commands.run("nm", obj).stdout == symbols
    assert _relocations_against("core", obj, commands) == relocations


def _relocations_against(symbol: str, obj: Path, commands: Commands) -> list[str]:
    listing = commands.run("readelf", "-rW", obj).stdout
    return [line.split(maxsplit=2)[2] for line in listing.splitlines() if symbol in line]


def test_the_module_sources_digest_follows_the_sources_and_the_patches(tmp_path: Path) -> None:
    sources = tmp_path / "kernel-open"
    sources.mkdir()
    (sources / "nv.c").write_text("int x;\n")
    patch = synthetic_patch(tmp_path, "--- a/nv.c\n+++ b/nv.c\n")

    unpatched = module_sources_digest(sources, [])
    patched = module_sources_digest(sources, [patch])
    assert unpatched.startswith("sha256:")
    assert patched != unpatched
    assert module_sources_digest(sources, [patch]) == patched, "stable for the same inputs"

    patch.path.write_text("--- a/nv.c\n+++ b/nv.c\n@@ changed @@\n")
    assert module_sources_digest(sources, [patch]) != patched
    (sources / "nv.c").write_text("int y;\n")
    assert module_sources_digest(sources, []) != unpatched


def test_the_module_sources_digest_follows_the_build_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package built by other build code (an older image's) is not reused."""
    sources = tmp_path / "kernel-open"
    sources.mkdir()
    (sources / "nv.c").write_text("int x;\n")
    kbuild = Path(build.__file__).parent
    assert build.build_code_digest() == build.tree_digest([kbuild], suffix=".py")
    assert "kbuild/build.py" in {str(p.relative_to(kbuild.parent)) for p in kbuild.glob("*.py")}
    before = module_sources_digest(sources, [])
    monkeypatch.setattr(build, "build_code_digest", lambda: "sha256:other")
    assert module_sources_digest(sources, []) != before


def _request(host: SimulatedHost, tmp_path: Path) -> build.BuildRequest:
    tree = tmp_path / "tree/build"
    tree.mkdir(parents=True)
    (tree / "Makefile").write_text("# kernel\n")
    (tree / "Module.symvers").write_text("0x0\tprintk\tvmlinux\tEXPORT_SYMBOL\t\n")
    (tree / ".config").write_text("CONFIG_GCC_VERSION=140201\n")
    commands = Commands(host.env())
    return build.BuildRequest(
        driver_version=DRIVER,
        module_type="open",
        kernel_release=KERNEL,
        banner=BANNER,
        tree=KernelTree(tree, tree, KERNEL, None, HOST),
        compiler=choose_compiler(kernel_config(tree), commands),
        module_sources=build.module_sources(
            host.path(f"/usr/src/nvidia-{DRIVER}"), "open", 580, KERNEL
        ),
        output=tmp_path / "cache/packages/open/package",
        log_dir=tmp_path / "cache/logs",
        scratch=tmp_path / "work/builds",
    )


@pytest.mark.parametrize("full", ["work/builds", "cache/packages/open"])
def test_a_full_disk_mid_build_is_one_line_and_leaves_nothing(
    host: SimulatedHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, full: str
) -> None:
    """The work directory (the sources' copy) or the cache (the package) filling up mid-build:
    one line that names the disk to make room on, not a traceback; no compile directory and no
    half package left."""
    copyfile = shutil.copyfile

    def disk_full(source: Path, target: Path, **kwargs: bool) -> Path:
        if Path(target).is_relative_to(tmp_path / full):
            raise OSError(errno.ENOSPC, "No space left on device", str(target))
        return copyfile(source, target, **kwargs)

    request = _request(host, tmp_path)
    monkeypatch.setattr(shutil, "copyfile", disk_full)
    with pytest.raises(DriverError) as failed:
        build.build_package(request, Commands(host.env()))
    message = str(failed.value)
    assert "\n" not in message
    assert message.endswith(f"make room in {tmp_path / full} (or make it writable) and retry")
    assert list((tmp_path / "work/builds").iterdir()) == []
    assert not request.output.parent.exists() or list(request.output.parent.iterdir()) == []


def test_a_compile_that_fills_the_disk_says_where_to_make_room(
    host: SimulatedHost, tmp_path: Path
) -> None:
    """make's first error line may be its own ("*** ... Error 1"), the reason only in the log:
    the one line still says the disk is full and where the compile ran."""
    (host.bin_dir / "make").write_text(
        "#!/bin/sh\necho '  CC [M]  nv.o'\n"
        'echo "make[3]: *** [scripts/Makefile.build:229: nv.o] Error 1"\n'
        "echo 'fixdep: error opening file: .nv.o.d: No space left on device'\nexit 2\n"
    )
    request = _request(host, tmp_path)
    with pytest.raises(DriverError) as failed:
        build.build_package(request, Commands(host.env()))
    message = str(failed.value)
    assert message.startswith("building the NVIDIA kernel modules failed: make[3]: *** [")
    assert message.endswith(f"the disk is full: make room in {tmp_path / 'work/builds'} and retry")
    assert list((tmp_path / "work/builds").iterdir()) == []
