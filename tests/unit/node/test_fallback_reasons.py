"""Why a node builds at runtime: the log line before the build and ``nvidia-driver status`` name
which of the causes it was (issue 38: "a fallback nobody can explain")."""

from __future__ import annotations

import pytest
from simhost import BANNER, DRIVER, SimulatedHost

from nvidia_driver.cli import main
from nvidia_driver.commands import Commands
from nvidia_driver.config import DriverConfig
from nvidia_driver.kbuild.pipeline import Pipeline
from nvidia_driver.naming import banner_release
from nvidia_driver.node.host import read_host_facts
from nvidia_driver.node.lifecycle import node_target
from nvidia_driver.paths import Paths

# The same kernel release built again: its banner differs in the build's time only.
REBUILT = BANNER.replace("18:02:03", "19:44:10")
OTHER_KERNEL = BANNER.replace("6.12.81-flatcar", "6.12.99-flatcar")


def precompiled_row(host: SimulatedHost, **env: str) -> str:
    result = host.run("status", **env)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(":", 1) for line in result.stdout.splitlines())
    return lines["Precompiled package"].strip()


def test_the_build_image_says_it_carries_no_packages(host: SimulatedHost) -> None:
    assert precompiled_row(host) == (
        "none: the image carries no precompiled packages (init would build one)"
    )


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ({"banner": OTHER_KERNEL, "kernel": "6.12.99-flatcar"},
         "the image's open packages are for other kernels: 6.12.99-flatcar"),
        ({"banner": REBUILT},
         ("its package for kernel 6.12.81-flatcar was built for another build of it: the "
          "node's /proc/version differs from the package's")),
        ({"driver": "570.195.03"},
         f"the image's packages are for driver 570.195.03, not {DRIVER}"),
        ({"module_type": "proprietary"},
         "the image has proprietary packages only, not open"),
    ],
    ids=["other-kernel", "rebuilt-kernel", "other-driver", "other-module-type"],
)  # fmt: skip
def test_status_names_why_no_package_serves_the_node(
    host: SimulatedHost, setup: dict[str, str], reason: str
) -> None:
    host.add_package(**setup)
    assert precompiled_row(host) == f"none: {reason} (init would build one)"


def test_mofed_is_named_as_the_reason(host: SimulatedHost) -> None:
    host.add_mellanox_nic()
    host.add_package("open")  # built without MOFED
    host.add_ofa_kernel()
    row = precompiled_row(host, GPU_DIRECT_RDMA_ENABLED="true", USE_HOST_MOFED="true")
    assert row.startswith("none: the node runs MOFED: nvidia-peermem is built against its "
                          "ofa_kernel")  # fmt: skip


def test_the_rebuilt_banner_names_the_same_release() -> None:
    assert banner_release(REBUILT) == banner_release(BANNER) != banner_release(OTHER_KERNEL)


def test_a_damaged_image_package_is_no_match_and_named_as_the_reason(
    host: SimulatedHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file of the image's package changed on the node's disk: init builds instead of
    installing it and failing its checksum at every restart; status says the same (in-process:
    SimulatedHost.run would run the installed copy)."""
    module = host.add_package("open") / "nvidia.ko"
    module.write_text("open nvidia.ko, a bit flipped\n")
    env = host.env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    paths = Paths(host.root)
    pipeline = Pipeline(paths, Commands(env), DriverConfig.from_env(env), "open")
    assert pipeline.package(node_target(read_host_facts(paths)), build=False) is None

    capsys.readouterr()
    assert main(["status"]) == 0
    rows = dict(line.split(":", 1) for line in capsys.readouterr().out.splitlines())
    assert rows["Precompiled package"].strip() == (
        f"none: its package for this kernel is damaged: {module} is missing or does not match "
        "its SHA-256 (init would build one)"
    )
