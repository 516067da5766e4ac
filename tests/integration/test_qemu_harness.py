"""The QEMU harness proves a module loads into the kernel it was built for, and catches one that
was not.

NVIDIA's open modules are built from the fixture .run's ``kernel-open/`` with their own Makefile
against Debian's 6.12.95 cloud headers, then insmodded into that kernel booted under QEMU (TCG,
no GPU): nvidia.ko must get as far as probing PCI and refuse with "NVRM: No NVIDIA GPU found"
and ENODEV, never "Invalid module format" or "Unknown symbol". Two controls keep the harness
honest: a hello-world module built against the same headers loads, and the same module built
against bookworm's stock 6.1 kernel is refused as an invalid module format.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from fixtures.kernel_headers import (
    build_kbuild_module,
    build_nvidia_modules,
    depends,
    kernel_headers,
    resolve,
)
from fixtures.qemu import DEFAULT_KERNEL, BootResult, boot_and_insmod, debian_kernel, load_order
from fixtures.qemu import modinfo as module_info
from fixtures.runfile import FORMAT_REVISION, build_run_fixture

pytestmark = pytest.mark.integration

DRIVER_VERSION = "535.261.03"
HELLO_REVISION = 1
HELLO_SOURCE = """\
#include <linux/init.h>
#include <linux/module.h>

static int __init gdc_hello_init(void)
{
\tpr_info("gdc-hello: loaded\\n");
\treturn 0;
}

static void __exit gdc_hello_exit(void)
{
}

module_init(gdc_hello_init);
module_exit(gdc_hello_exit);
MODULE_LICENSE("GPL");
"""


@pytest.fixture(scope="session")
def nvidia_open_modules() -> Path:
    """NVIDIA's open modules for the booted kernel, built once and cached by their inputs."""
    runfile = build_run_fixture(DRIVER_VERSION)

    def kernel_open_sources(scratch: Path) -> Path:
        # Extract the way NVIDIA's users do: by running the .run's own stub.
        subprocess.run(["sh", runfile, "-x", "--target", scratch], check=True, capture_output=True)
        return scratch / "kernel-open"

    key = f"nvidia-open-{DRIVER_VERSION}-run-r{FORMAT_REVISION}"
    return build_nvidia_modules(kernel_headers(DEFAULT_KERNEL), key, kernel_open_sources)


@pytest.fixture(scope="session")
def other_kernel_release() -> str:
    """Bookworm's stock cloud kernel (6.1): a kernel the 6.12 builds must not load into."""
    meta = resolve("linux-headers-cloud-amd64", suite="bookworm")
    (headers,) = [name for name in depends(meta) if name.startswith("linux-headers-")]
    return headers.removeprefix("linux-headers-")


def hello_module(kernel_release: str) -> Path:
    def write_sources(scratch: Path) -> Path:
        scratch.mkdir(parents=True)
        (scratch / "gdc_hello.c").write_text(HELLO_SOURCE)
        (scratch / "Kbuild").write_text("obj-m := gdc_hello.o\n")
        return scratch

    headers = kernel_headers(kernel_release)
    built = build_kbuild_module(headers, f"gdc-hello-r{HELLO_REVISION}", write_sources)
    return built / "gdc_hello.ko"


@pytest.fixture(scope="session")
def hello_for_booted_kernel() -> Path:
    return hello_module(DEFAULT_KERNEL)


@pytest.fixture(scope="session")
def hello_for_other_kernel(other_kernel_release: str) -> Path:
    return hello_module(other_kernel_release)


@pytest.fixture(scope="session")
def boot(
    nvidia_open_modules: Path, hello_for_other_kernel: Path, hello_for_booted_kernel: Path
) -> BootResult:
    """One boot for all three modules: TCG boots cost tens of seconds each."""
    # The wrong build goes first: were the good hello loaded before it, the kernel would
    # refuse the second gdc_hello as a duplicate (EEXIST), not for its format.
    modules = [nvidia_open_modules / "nvidia.ko", hello_for_other_kernel, hello_for_booted_kernel]
    return boot_and_insmod(modules)


def test_nvidia_open_module_is_built_for_the_booted_kernel(nvidia_open_modules: Path) -> None:
    (vermagic,) = module_info(nvidia_open_modules / "nvidia.ko")["vermagic"]
    assert vermagic.startswith(f"{DEFAULT_KERNEL} ")


def test_nvidia_open_module_loads_until_it_finds_no_gpu(
    boot: BootResult, nvidia_open_modules: Path
) -> None:
    load = boot.load(nvidia_open_modules / "nvidia.ko")
    assert "NVRM: No NVIDIA GPU found" in load.kernel_log, boot.console
    assert load.errno_name == "ENODEV", boot.console
    assert "No such device" in load.message


def test_nvidia_open_module_has_no_format_or_symbol_errors(
    boot: BootResult, nvidia_open_modules: Path
) -> None:
    load = boot.load(nvidia_open_modules / "nvidia.ko")
    output = f"{load.message}\n{load.kernel_log}".lower()
    for refusal in ("invalid module format", "unknown symbol", "disagrees about version"):
        assert refusal not in output, boot.console


def test_module_for_the_booted_kernel_loads(
    boot: BootResult, hello_for_booted_kernel: Path
) -> None:
    load = boot.load(hello_for_booted_kernel)
    assert load.loaded, boot.console
    assert "gdc-hello: loaded" in load.kernel_log


def test_module_for_another_kernel_is_refused_as_invalid_format(
    boot: BootResult, hello_for_other_kernel: Path
) -> None:
    load = boot.load(hello_for_other_kernel)
    assert load.errno_name == "ENOEXEC", boot.console
    # busybox spells kmod's "Invalid module format" in lower case.
    assert "invalid module format" in load.message.lower()


def test_vm_powers_off_after_the_last_module(boot: BootResult) -> None:
    assert boot.finished
    assert "reboot: Power down" in boot.console


def test_load_order_puts_dependencies_first(nvidia_open_modules: Path) -> None:
    nvidia = nvidia_open_modules / "nvidia.ko"
    uvm = nvidia_open_modules / "nvidia-uvm.ko"
    assert module_info(uvm)["depends"] == ["nvidia"]
    assert load_order([uvm, nvidia], debian_kernel()) == [nvidia, uvm]


def test_load_order_keeps_two_builds_of_one_module(
    hello_for_other_kernel: Path, hello_for_booted_kernel: Path
) -> None:
    modules = [hello_for_other_kernel, hello_for_booted_kernel]
    assert load_order(modules, debian_kernel()) == modules
