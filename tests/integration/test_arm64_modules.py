"""arm64 proven: NVIDIA's open modules cross-built by the project's code load into a real arm64
kernel.

``nvidia-driver build`` cross-builds NVIDIA 550.163.01's open modules (Debian's arm64
nvidia-open-kernel-source, whose nv-kernel.o_binary is NVIDIA's aarch64 core) on this amd64
machine for a simulated arm64 node running Debian trixie's 6.12.117 arm64 cloud kernel, built
by gcc 14 as Flatcar's 4230.1.0 to 4593 are (fixtures/cross_build.py): the build sees the tree
is for arm64 and takes ``aarch64-linux-gnu-gcc-14``, ``ARCH=arm64``,
``CROSS_COMPILE=aarch64-linux-gnu-`` and the cross strip, after checking that the tree's host
tools run here. The package's modules are then insmod-ed into that kernel under
``qemu-system-aarch64`` (fixtures/qemu_aarch64.py): nvidia.ko must stop at "NVRM: No NVIDIA GPU
found", never at "Invalid module format" or "Unknown symbol", and the banner the package is
matched by must be the booted kernel's own /proc/version.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from fixtures.cross_build import ARM64_DRIVER, CrossBuild, cross_build_open
from fixtures.kernel import TRIXIE_ARM64_KERNEL, KernelTree, kernel_tree
from fixtures.qemu import BootResult
from fixtures.qemu import modinfo as module_info
from fixtures.qemu_aarch64 import ARM64_KERNEL, arm64_kernel, boot_and_insmod_aarch64

from nvidia_driver.formats.vmlinuz import kernel_banner_from_file
from nvidia_driver.kbuild.packages import Package, load_package

pytestmark = [pytest.mark.integration, pytest.mark.arm64]

DRIVER = ARM64_DRIVER
NO_GPU = "NVRM: No NVIDIA GPU found"
BROKEN_BUILD = ("invalid module format", "unknown symbol", "disagrees about version")
EM_AARCH64 = 183


@pytest.fixture(scope="session")
def arm64_tree() -> KernelTree:
    return kernel_tree(TRIXIE_ARM64_KERNEL)


@pytest.fixture(scope="session")
def arm64_banner(arm64_tree: KernelTree) -> str:
    """The banner the project's reader finds in the arm64 Image (what a release's is read by)."""
    return kernel_banner_from_file(arm64_tree.vmlinuz)


@pytest.fixture(scope="session")
def arm64_cross_build(arm64_tree: KernelTree, arm64_banner: str) -> CrossBuild:
    return cross_build_open(arm64_tree, arm64_banner, DRIVER)


@pytest.fixture(scope="session")
def arm64_open_package(arm64_cross_build: CrossBuild) -> Package:
    package = load_package(arm64_cross_build.package_dir("open"))
    assert package is not None, arm64_cross_build.log
    return package


@pytest.fixture(scope="session")
def arm64_boot(arm64_open_package: Package) -> BootResult:
    """One boot for nvidia.ko: with no GPU it refuses to stay loaded, so the modules that
    depend on it could only fail for its symbols (they are checked statically below)."""
    return boot_and_insmod_aarch64([arm64_open_package.path / "nvidia.ko"], ARM64_KERNEL)


def _symbols(module: Path) -> tuple[set[str], set[str]]:
    """(undefined, exported) symbol names of a module, by readelf (it reads any arch)."""
    listing = subprocess.run(["readelf", "-sW", str(module)], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    undefined, exported = set(), set()
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) == 8 and fields[0].endswith(":"):
            if fields[6] == "UND" and fields[7]:
                undefined.add(fields[7])
            elif fields[7].startswith("__ksymtab_"):
                exported.add(fields[7].removeprefix("__ksymtab_"))
    return undefined, exported


def _elf_machine(path: Path) -> int:
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF", path
    return int.from_bytes(header[18:20], "little")


def test_the_build_cross_compiles_with_the_kernels_gcc_for_arm64(
    arm64_cross_build: CrossBuild, arm64_open_package: Package
) -> None:
    log = arm64_cross_build.log
    assert "The kernel is for arm64: cross-building for arm64 on this amd64 machine" in log
    assert "Compiling NVIDIA driver kernel modules with aarch64-linux-gnu-gcc-14 (Debian 14." in log
    assert arm64_open_package.metadata.compiler.startswith("aarch64-linux-gnu-gcc-14 (Debian 14.")
    assert arm64_open_package.metadata.debug_info_stripped  # by aarch64-linux-gnu-strip
    assert "nvidia.ko" in arm64_open_package.metadata.modules


def test_every_packaged_module_is_aarch64_for_the_arm64_kernel(
    arm64_open_package: Package,
) -> None:
    # What the kernel's own modules carry: "6.12.117+deb13-cloud-arm64 SMP mod_unload
    # modversions aarch64".
    (kernels_vermagic,) = module_info(arm64_kernel().in_tree_modules()["dummy"])["vermagic"]
    assert kernels_vermagic.startswith(f"{ARM64_KERNEL} ")
    for name in arm64_open_package.metadata.modules:
        module = arm64_open_package.path / name
        assert _elf_machine(module) == EM_AARCH64, name
        assert module_info(module)["vermagic"] == [kernels_vermagic], name
    comment = subprocess.run(
        ["readelf", "-p", ".comment", str(arm64_open_package.path / "nvidia.ko")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "GCC: (Debian 14." in comment


def test_nvidia_ko_loads_into_the_arm64_kernel_until_it_finds_no_gpu(
    arm64_boot: BootResult, arm64_open_package: Package
) -> None:
    load = arm64_boot.load(arm64_open_package.path / "nvidia.ko")
    assert NO_GPU in load.kernel_log, arm64_boot.console
    assert load.errno_name == "ENODEV", arm64_boot.console
    output = f"{load.message}\n{load.kernel_log}".lower()
    for refusal in BROKEN_BUILD:
        assert refusal not in output, arm64_boot.console
    assert arm64_boot.finished, arm64_boot.console


def test_no_module_of_the_package_is_refused_for_its_format_or_symbols(
    arm64_boot: BootResult,
) -> None:
    console = arm64_boot.console.lower()
    for refusal in BROKEN_BUILD:
        assert refusal not in console, arm64_boot.console


def test_the_package_banner_is_the_booted_kernels_proc_version(
    arm64_boot: BootResult, arm64_open_package: Package
) -> None:
    assert arm64_boot.booted, arm64_boot.console
    assert arm64_open_package.metadata.banner == arm64_boot.proc_version
    assert arm64_open_package.metadata.kernel_release == ARM64_KERNEL


def test_the_other_modules_need_only_the_kernels_and_the_packages_symbols(
    arm64_open_package: Package, arm64_tree: KernelTree
) -> None:
    """What nvidia-uvm, -modeset, -drm and -peermem link against is exported by the booted
    kernel (its Module.symvers) or by the package's own modules: once nvidia.ko loads on a GPU
    node, none is refused for an unknown symbol."""
    kernel = {line.split("\t")[1] for line in
              (arm64_tree.build_dir / "Module.symvers").read_text().splitlines()}  # fmt: skip
    modules = [arm64_open_package.path / name for name in arm64_open_package.metadata.modules]
    symbols = {module.name: _symbols(module) for module in modules}
    exported = set().union(*(exports for _, exports in symbols.values()))
    assert "nvUvmInterfaceRegisterGpu" in exported  # nvidia.ko's, which nvidia-uvm needs
    for name, (undefined, _) in symbols.items():
        unresolved = undefined - kernel - exported
        assert not unresolved, (name, sorted(unresolved)[:20])
