"""The runtime path on an arm64 node (GH200, GB200).

The simulated node has an aarch64 Flatcar banner, the ``arm64-usr`` board, TARGETARCH=arm64 (as
the arm64 image sets it) and its self-hosted Grace GPUs, which require the open modules. Its
kernel tree's ``.config`` says ``CONFIG_ARM64=y``: built natively on an arm64 machine, cross
(``ARCH=arm64``, ``CROSS_COMPILE=aarch64-linux-gnu-``, the cross gcc and strip) on an amd64 one,
which is where the unit tests usually run. The expectations follow the machine they run on.
The cross build's own choices are tested in kbuild/test_crossbuild.py.
"""

from __future__ import annotations

import pytest
from simhost import ARM64_BANNER, GB200, GH200, KERNEL, SimulatedHost

from nvidia_driver import cli
from nvidia_driver.naming import machine_arch

ON_ARM64 = machine_arch() == "arm64"


@pytest.mark.parametrize("gpu", [GH200, GB200], ids=["gh200", "gb200"])
def test_an_arm64_grace_node_installs_the_open_package_for_its_aarch64_banner(
    host: SimulatedHost, gpu: int
) -> None:
    host.become_arm64(gpu)
    host.add_package("open", banner=ARM64_BANNER)
    host.add_package("proprietary", banner=ARM64_BANNER)
    driver = host.start("init")
    driver.wait_for("Done, now waiting for signal")
    assert "Using the open kernel modules" in driver.output
    assert "(self-hosted Grace) require open modules" in driver.output
    assert "kernel interface matches." in driver.output
    installed = host.path(f"/lib/modules/{KERNEL}/kernel/drivers/video/nvidia.ko")
    assert installed.read_text() == "open nvidia.ko\n"
    assert not host.calls("make")
    assert driver.terminate() == 0


def test_an_amd64_banner_does_not_match_on_an_arm64_node(host: SimulatedHost) -> None:
    """The amd64 package of the same release differs in its banner (the compiler's name)."""
    host.become_arm64(GH200)
    host.add_package("open")  # the amd64 banner
    result = host.run("load")
    assert result.returncode == 1
    assert "kernel interface matches." not in result.stdout


def test_proprietary_modules_are_refused_on_a_grace_node(host: SimulatedHost) -> None:
    host.become_arm64(GB200)
    result = host.run("init", KERNEL_MODULE_TYPE="proprietary")
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("ERROR: ")
    assert "open" in line


def test_an_arm64_node_builds_its_arm64_tree_with_the_kernels_gcc(host: SimulatedHost) -> None:
    host.become_arm64(GH200)
    host.add_host_kernel_tree(arch="arm64")
    driver = host.start("init")
    driver.wait_for("Done, now waiting for signal")
    assert "Using the open kernel modules" in driver.output
    [make] = host.calls("make")
    if ON_ARM64:
        assert "CC=gcc-14" in make
        assert "CROSS_COMPILE" not in make
    else:
        assert "CC=aarch64-linux-gnu-gcc-14" in make
        assert make.endswith(" ARCH=arm64 CROSS_COMPILE=aarch64-linux-gnu-")
        assert "cross-building for arm64 on this amd64 machine" in driver.output
        assert host.calls("aarch64-linux-gnu-strip")
        assert not host.calls("strip")
    assert driver.terminate() == 0


def test_a_tree_of_another_arch_than_targetarch_is_refused_in_one_line(
    host: SimulatedHost,
) -> None:
    host.add_host_kernel_tree(arch="arm64")  # the amd64 node's TARGETARCH is amd64
    result = host.run("build", "--module-type", "open")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "ERROR: the kernel build tree is for arm64 (CONFIG_ARM64=y in its .config), not for "
        "amd64 (TARGETARCH): use the amd64 release's tree or set TARGETARCH=arm64"
    )
    assert not host.calls("make")


def test_an_arm64_host_that_is_not_flatcar_builds_from_its_own_tree(
    host: SimulatedHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ALLOW_NON_FLATCAR=true: Ubuntu's VERSION_ID (24.04) names no Flatcar release, so no
    Flatcar rule (arm64 trees before 4230.1.0) applies and nothing is fetched for it."""
    host.become_arm64(GH200)
    host.set_os_release('ID=ubuntu\nVERSION_ID="24.04"\nPRETTY_NAME="Ubuntu 24.04"\n')
    host.add_host_kernel_tree(arch="arm64")
    for name, value in host.env(ALLOW_NON_FLATCAR="true").items():
        monkeypatch.setenv(name, value)
    assert cli.main(["build", "--module-type", "open"]) == 0
    assert len(host.calls("make")) == 1
