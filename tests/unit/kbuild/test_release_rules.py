"""What each Flatcar release offers a module build, and where the build keeps its material.

LTS 4081 ships a tree in the older split layout, arm64 before 4230.1.0 ships one with x86-64
host tools, and a tree without Module.symvers cannot work: each is decided before ``make``.
Large material goes to the work directory on disk, not to /run (see cachedirs.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kerneltree_fixtures import copy_tool, flatcar_root
from simhost import DRIVER, FLATCAR_OS_RELEASE_UNQUOTED, KERNEL, SimulatedHost

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.kbuild import hosttools, hosttree, kerneltree
from nvidia_driver.kbuild.build import BuildRequest, build_package, module_sources
from nvidia_driver.kbuild.cachedirs import sweep_stale, work_dir
from nvidia_driver.kbuild.compiler import choose_compiler, kernel_config
from nvidia_driver.paths import Paths
from nvidia_driver.settings import NVIDIA_DRIVER_WORK_DIR
from nvidia_driver.sources.flatcar import has_container_tree, has_native_host_tools

LTS = "4081.3.10"
LTS_KERNEL = "6.6.150-flatcar"
LTS_BANNER = (
    f"Linux version {LTS_KERNEL} (build@pony-truck.infra.kinvolk.io) "
    "(x86_64-cros-linux-gnu-gcc (Gentoo Hardened 13.3.1_p20240614 p1) 13.3.1 20240614, "
    "GNU ld (Gentoo 2.42 p6) 2.42.0) #1 SMP PREEMPT_DYNAMIC Tue Aug 12 17:05:11 -00 2026"
)
GCC_13 = """#!/bin/sh
echo "gcc-13 $*" >> "$STUB_LOG"
case "$1" in
  -dumpfullversion) echo 13.4.0;;
  --version) echo "gcc-13 (Debian 13.4.0-4) 13.4.0";;
esac
"""
WORK = "/var/cache/nvidia-driver"


def _lts_node(host: SimulatedHost, arch_os_release: str = "amd64-usr") -> None:
    host.set_kernel(LTS_KERNEL, LTS_BANNER)
    host.set_os_release(
        FLATCAR_OS_RELEASE_UNQUOTED.replace("4593.2.0", LTS).replace("amd64-usr", arch_os_release)
    )
    (host.bin_dir / "gcc-13").write_text(GCC_13)
    (host.bin_dir / "gcc-13").chmod(0o755)


@pytest.mark.parametrize(
    ("version", "container_tree", "native_on_arm64"),
    [
        ("4081.3.10", False, False),  # LTS 2024: split layout, x86-64 tools on arm64
        ("4230.3.0", True, True),  # the first LTS cut from the 4230 branch
        ("4230.1.0", True, True),
        ("4230.0.1", False, False),
        ("4277.0.0", True, True),
        ("4593.2.5", True, True),
    ],
)
def test_what_each_release_ships(version: str, container_tree: bool, native_on_arm64: bool) -> None:
    assert has_container_tree(version) is container_tree
    assert has_native_host_tools(version, "arm64") is native_on_arm64
    assert has_native_host_tools(version, "amd64")


def test_an_lts_4081_node_builds_from_its_own_split_layout_tree(host: SimulatedHost) -> None:
    """No download: the cleaned build/ and the stripped source/ are copied and used as they are,
    with the image's gcc-13 (LTS 4081's kernels are built by gcc 13.3)."""
    _lts_node(host)
    host.add_host_kernel_tree(LTS_KERNEL, gcc=130301, split_source=True)
    driver = host.start("init")
    driver.wait_for("Done, now waiting for signal")
    modules = host.path(f"{WORK}/trees/host-{LTS_KERNEL}/usr/lib/modules/{LTS_KERNEL}")
    [make] = host.calls("make")
    assert f"SYSSRC={modules / 'source'} " in make
    assert f"SYSOUT={modules / 'build'} " in make
    assert "CC=gcc-13" in make
    assert "release.flatcar-linux.net" not in driver.output  # nothing fetched
    assert "developer container" not in driver.output
    # The tree, the compile directory and all else on disk are gone once the package is built.
    assert list(host.path(WORK).iterdir()) == []
    assert driver.terminate() == 0


def test_an_arm64_lts_4081_node_is_refused_with_what_to_do(host: SimulatedHost) -> None:
    _lts_node(host, "arm64-usr")
    host.add_host_kernel_tree(LTS_KERNEL, gcc=130301, split_source=True)
    result = host.run("init", TARGETARCH="arm64")
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"ERROR: Flatcar {LTS} on arm64 cannot build kernel modules:")
    assert "x86-64 host tools" in line
    assert "update the node to Flatcar 4230.1.0 or later" in line
    assert not host.calls("make")
    assert not host.path(f"{WORK}/trees").exists()  # refused before copying anything


def _foreign_tool(path: Path) -> None:
    tool = copy_tool("/bin/true", path)
    data = bytearray(tool.read_bytes())
    data[18] = 183 if data[18] != 183 else 62  # e_machine: aarch64, or x86-64 on aarch64
    tool.write_bytes(bytes(data))


def test_host_tree_leaves_a_foreign_architecture_tree_to_its_caller(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "root")
    flatcar_root(paths.host_filesystem)
    _foreign_tool(paths.host_kernel_tree(KERNEL) / "scripts/basic/fixdep")
    with pytest.raises(hosttools.ForeignToolsError, match="cannot run here"):
        hosttree.host_tree(paths, KERNEL, tmp_path / "work/tree")
    assert list((tmp_path / "work").iterdir()) == []  # nothing half-copied


def test_init_falls_back_to_the_releases_tree_when_the_hosts_tools_are_foreign(
    host: SimulatedHost,
) -> None:
    """On a release whose trees are native (4230.1.0 on), a foreign tree on the node is the
    node's problem, not the release's: init fetches the release's tree instead of stopping."""
    host.add_host_kernel_tree()
    _foreign_tool(host.path(f"/proc/1/root/usr/lib/modules/{KERNEL}/build/scripts/basic/fixdep"))
    result = host.run("init", FLATCAR_RELEASE_BASE_URL="file:///nonexistent/{channel}")
    assert "the kernel tree's fixdep is built for ELF machine" in result.stdout
    assert "using the kernel build tree of Flatcar 4593.2.0 instead" in result.stdout
    [line] = result.stderr.strip().splitlines()
    assert "flatcar-container.tar.gz" in line  # it went for the release's tree
    assert not host.calls("make")


def test_a_host_tree_without_module_symvers_is_not_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = Paths(tmp_path / "root")
    flatcar_root(paths.host_filesystem)
    (paths.host_kernel_tree(KERNEL) / "Module.symvers").write_text("")
    assert hosttree.host_tree(paths, KERNEL, tmp_path / "tree") is None
    assert "no Module.symvers (or an empty one)" in capsys.readouterr().out


def test_a_split_host_tree_needs_its_source_makefile(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "root")
    flatcar_root(paths.host_filesystem, split_source=True)
    (paths.host_kernel_tree(KERNEL).parent / "source/Makefile").unlink()
    assert hosttree.host_tree(paths, KERNEL, tmp_path / "tree") is None


@pytest.mark.parametrize("symvers", [None, ""])
def test_a_tree_without_module_symvers_is_refused_before_make(
    host: SimulatedHost, tmp_path: Path, symvers: str | None
) -> None:
    build = tmp_path / "tree/build"
    build.mkdir(parents=True)
    (build / "Makefile").write_text("# kernel\n")
    (build / ".config").write_text("CONFIG_GCC_VERSION=140201\n")
    if symvers is not None:
        (build / "Module.symvers").write_text(symvers)
    commands = Commands(host.env())
    request = BuildRequest(
        driver_version=DRIVER,
        module_type="open",
        kernel_release=KERNEL,
        banner="Linux version",
        tree=kerneltree.KernelTree(build, build, KERNEL, None, kerneltree.HOST),
        compiler=choose_compiler(kernel_config(build), commands),
        module_sources=module_sources(host.path(f"/usr/src/nvidia-{DRIVER}"), "open", 580, KERNEL),
        output=tmp_path / "out/package",
        log_dir=tmp_path / "logs",
    )
    with pytest.raises(DriverError) as refused:
        build_package(request, commands)
    message = str(refused.value)
    assert "\n" not in message
    assert f"has no Module.symvers, or an empty one ({build / 'Module.symvers'})" in message
    assert "modules_prepare" in message
    assert not host.calls("make")
    assert not (tmp_path / "logs").exists()


def test_init_sweeps_what_a_killed_run_left(host: SimulatedHost) -> None:
    cache = host.path("/run/nvidia/cache")
    stale = [
        cache / "downloads/.scratch-k1ll3d",  # a download in flight (older images)
        cache / "trees/.incoming-k1ll3d",  # an extraction in flight (older images)
        cache / f"packages/{DRIVER}/open/.build.k1ll3d",  # a compile
        cache / f"packages/{DRIVER}/open/.{KERNEL}-0123.k1ll3d",  # a package being written
        host.path(f"{WORK}/trees/host-{KERNEL}"),  # a tree copied for a build never finished
    ]
    for path in stale:
        (path / "junk").mkdir(parents=True)
    kept = host.add_package("open")
    driver = host.start("init")
    driver.wait_for("Done, now waiting for signal")
    assert "Removed 5 entries left by an interrupted run" in driver.output
    assert not any(path.exists() for path in stale)
    assert kept.is_dir()
    assert driver.terminate() == 0


def test_sweep_keeps_finished_entries(tmp_path: Path) -> None:
    cache, work = tmp_path / "cache", tmp_path / "work"
    finished = [cache / "downloads/sha512/ab", cache / "banners", cache / "logs"]
    for path in finished:
        path.mkdir(parents=True)
    (cache / "downloads/.cache.lock").write_text("")
    assert sweep_stale(cache, work) == []
    assert all(path.exists() for path in finished)
    assert (cache / "downloads/.cache.lock").exists()


def test_the_work_directory_is_configurable(tmp_path: Path) -> None:
    default = tmp_path / "var/cache/nvidia-driver"
    assert work_dir(default, {}) == default
    assert work_dir(default, {NVIDIA_DRIVER_WORK_DIR: "/mnt/disk/nvidia"}) == Path(
        "/mnt/disk/nvidia"
    )
