"""A refusal that the node's facts and settings decide comes before anything on the node changes:
without k8s-driver-manager, or on a container restart, the driver loaded before stays loaded.

In-process (SimulatedHost.run would run the installed copy); the commands are simhost's stubs.
"""

from __future__ import annotations

import pytest
from simhost import B200, BANNER, KERNEL, V100, SimulatedHost

from nvidia_driver.cli import main
from nvidia_driver.node import lifecycle

OLD_DIGEST = "digest-of-the-loaded-driver"


def loaded_node(host: SimulatedHost, monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    """The node runs a driver an earlier pod loaded; this pod's settings have another digest."""
    for module, refcnt in (("nvidia", 2), ("nvidia_uvm", 0), ("nvidia_modeset", 0)):
        host.set_module(module, refcnt)
    host.write("/run/nvidia/nvidia-driver.state", OLD_DIGEST)
    for name, value in host.env(DRIVER_CONFIG_DIGEST="digest-of-the-new-settings", **env).items():
        monkeypatch.setenv(name, value)
    # A regression would reach the cleanup, which ignores SIGINT: not in this test process.
    monkeypatch.setattr(lifecycle, "ignore_signals", lambda: None)


def assert_left_alone(host: SimulatedHost) -> None:
    assert not host.calls("rmmod")
    assert all(host.is_loaded(m) for m in ("nvidia", "nvidia_uvm", "nvidia_modeset"))
    assert host.path("/run/nvidia/nvidia-driver.state").read_text() == OLD_DIGEST
    assert not host.path("/run/nvidia/validations/.driver-daemons-status").exists()
    assert not host.path("/run/nvidia/nvidia-driver.pid").exists()


@pytest.mark.parametrize(
    "refusal",
    [
        (B200, {"KERNEL_MODULE_TYPE": "proprietary"}, "require open modules"),
        (V100, {"KERNEL_MODULE_TYPE": "open"}, "predate Turing and have no GSP"),
        (V100, {"DRIVER_VERSION": "595.91.07"}, "driver branch 595 does not support"),
    ],
    ids=["proprietary-on-blackwell", "open-on-volta", "595-on-volta"],
)
@pytest.mark.parametrize("command", ["init", "load"])
def test_a_module_type_that_does_not_fit_leaves_the_loaded_driver_alone(
    host: SimulatedHost,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    refusal: tuple[int, dict[str, str], str],
    command: str,
) -> None:
    gpu, env, message = refusal
    for device in host.path("/sys/bus/pci/devices").iterdir():
        (device / "device").write_text(f"0x{gpu:04x}\n")
    host.add_package("open")
    host.add_package("proprietary")
    loaded_node(host, monkeypatch, **env)

    assert main([command]) == 1
    assert message in capsys.readouterr().err
    assert_left_alone(host)


def test_load_without_a_package_for_the_kernel_leaves_the_loaded_driver_alone(
    host: SimulatedHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """load compiles nothing: whether a package serves the node is known before it unloads."""
    host.add_package("open", banner=BANNER.replace("18:02:03", "19:44:10"))  # another build
    loaded_node(host, monkeypatch)

    assert main(["load"]) == 1
    assert f"no precompiled package for kernel {KERNEL}" in capsys.readouterr().err
    assert_left_alone(host)
