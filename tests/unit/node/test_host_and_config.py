from __future__ import annotations

from pathlib import Path

import pytest
from simhost import (
    B200,
    FLATCAR_OS_RELEASE_QUOTED,
    FLATCAR_OS_RELEASE_UNQUOTED,
    GB200,
    H100,
    L40S,
    V100,
    SimulatedHost,
)

from nvidia_driver.config import DriverConfig
from nvidia_driver.errors import DriverError
from nvidia_driver.node.daemons import imex_domain
from nvidia_driver.node.host import PciDevice, parse_os_release, read_host_facts, resolve_within
from nvidia_driver.node.moduletype import resolve_module_type
from nvidia_driver.paths import Paths


def gpu(device: int) -> PciDevice:
    return PciDevice("0000:18:00.0", 0x10DE, device, 0x030200)


@pytest.mark.parametrize(
    "text", [FLATCAR_OS_RELEASE_UNQUOTED, FLATCAR_OS_RELEASE_QUOTED], ids=["4593", "4757"]
)
def test_both_flatcar_os_release_formats(text: str) -> None:
    values = parse_os_release(text)
    assert values["ID"] == "flatcar"
    assert values["VERSION_ID"] in ("4593.2.0", "4757.1.0")
    assert values["FLATCAR_BOARD"] == "amd64-usr"
    assert values["PRETTY_NAME"].startswith("Flatcar Container Linux by Kinvolk ")
    assert values["SUPPORT_URL" if "SUPPORT_URL" in values else "ID_LIKE"] in (
        "coreos",
        "https://groups.google.com/forum/#!forum/flatcar-linux-user",
    )


def test_single_quotes_and_comments() -> None:
    values = parse_os_release('# comment\nCPE_NAME=\'cpe:2.3:o:x\'\n\nBROKEN\nNAME="a \\"b\\""\n')
    assert values == {"CPE_NAME": "cpe:2.3:o:x", "NAME": 'a "b"'}


@pytest.mark.parametrize("target", ["../usr/lib/os-release", "/usr/lib/os-release"])
def test_a_symlink_resolves_inside_the_host_root(tmp_path: Path, target: str) -> None:
    root = tmp_path / "root"
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/os-release").write_text("ID=flatcar\n")
    (root / "etc").mkdir()
    (root / "etc/os-release").symlink_to(target)
    assert resolve_within(root, root / "etc/os-release") == root / "usr/lib/os-release"


def test_os_release_falls_back_to_the_host_filesystem(host: SimulatedHost) -> None:
    host.path("/host-etc/os-release").unlink()
    host.write("/proc/1/root/usr/lib/os-release", FLATCAR_OS_RELEASE_QUOTED)
    link = host.path("/proc/1/root/etc/os-release")
    link.parent.mkdir(parents=True)
    link.symlink_to("../usr/lib/os-release")
    facts = read_host_facts(Paths(host.root))
    assert facts.version_id == "4757.1.0"


def test_the_imex_domain_behind_an_absolute_link_is_the_hosts(host: SimulatedHost) -> None:
    """Through /proc/1/root the kernel resolves an absolute link against the container's root,
    not the node's: the node's own file would be missed, and IMEX skipped."""
    host.write("/proc/1/root/var/lib/imex/nodes_config.cfg", "10.0.0.1\n10.0.0.2\n")
    link = host.path("/proc/1/root/etc/nvidia-imex/nodes_config.cfg")
    link.parent.mkdir(parents=True)
    link.symlink_to("/var/lib/imex/nodes_config.cfg")
    assert imex_domain(Paths(host.root)) == ["10.0.0.1", "10.0.0.2"]


def test_host_facts(host: SimulatedHost) -> None:
    host.add_nvswitches(2)
    host.add_nvlink5_port()
    host.set_lockdown("none")
    host.set_module("nvidia", 3)
    facts = read_host_facts(Paths(host.root))
    assert facts.is_flatcar
    assert facts.kernel_release == "6.12.81-flatcar"
    assert facts.proc_version.startswith("Linux version 6.12.81-flatcar (build@")
    assert [gpu.device for gpu in facts.gpus] == [H100]
    assert len(facts.nvswitches) == 2
    assert facts.nvlink5_ports == ["mlx5_0"]
    assert facts.lockdown == "none"
    assert not facts.lockdown_active
    assert facts.module_refcounts["nvidia"] == 3


def test_lockdown_is_read_from_the_hosts_securityfs(host: SimulatedHost) -> None:
    """The runtime mounts the container a fresh sysfs without securityfs on it (tigera/operator
    PR 4992: the lockdown file is absent in a container): the host's, through /proc/1/root."""
    host.write("/proc/1/root/sys/kernel/security/lockdown", "none [integrity] confidentiality\n")
    facts = read_host_facts(Paths(host.root))
    assert facts.lockdown == "integrity"
    assert facts.lockdown_active


def test_selinux_is_read_from_the_hosts_selinuxfs(host: SimulatedHost) -> None:
    """Nor has the container the host's selinuxfs (NVIDIA/gpu-driver-container 2957a8b reads
    /proc/1/root/sys/fs/selinux/enforce): an enforcing host's driver root gets relabelled."""
    host.write("/proc/1/root/sys/fs/selinux/enforce", "1")
    assert read_host_facts(Paths(host.root)).selinux_enforcing


def test_unreadable_kernel_version_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DriverError, match="cannot read the kernel version"):
        read_host_facts(Paths(tmp_path))


@pytest.mark.parametrize(
    ("branch", "devices", "expected"),
    [
        (580, [H100], "open"),
        (550, [H100], "proprietary"),
        (580, [L40S], "open"),
        (580, [V100], "proprietary"),
        (580, [GB200], "open"),
        (535, [GB200], "open"),
        (580, [H100, V100], "proprietary"),
        (580, [], "open"),
        (535, [], "proprietary"),
    ],
)
def test_auto_module_type(branch: int, devices: list[int], expected: str) -> None:
    choice = resolve_module_type("auto", branch, [gpu(device) for device in devices])
    assert choice.module_type == expected
    assert choice.reason.startswith("auto: ")


def test_no_module_type_fits_grace_and_volta_together() -> None:
    with pytest.raises(DriverError, match="no kernel module type fits this node"):
        resolve_module_type("auto", 580, [gpu(GB200), gpu(V100)])


def test_forced_types_that_cannot_work_are_refused() -> None:
    with pytest.raises(DriverError, match="KERNEL_MODULE_TYPE=open, but"):
        resolve_module_type("open", 580, [gpu(V100)])
    with pytest.raises(DriverError, match="KERNEL_MODULE_TYPE=proprietary, but"):
        resolve_module_type("proprietary", 580, [gpu(GB200)])


@pytest.mark.parametrize("device", [B200, 0x2BB5], ids=["b200", "rtx-pro-6000-blackwell"])
def test_blackwell_gpus_refuse_the_proprietary_modules(device: int) -> None:
    """The proprietary nvidia.ko loads on Blackwell but cannot drive it ("requires use of the
    NVIDIA open kernel modules", RmInitAdapter failed): refused before anything is built."""
    with pytest.raises(DriverError, match=r"KERNEL_MODULE_TYPE=proprietary, but .* require open"):
        resolve_module_type("proprietary", 580, [gpu(device)])
    choice = resolve_module_type("auto", 550, [gpu(device)])
    assert choice.module_type == "open"
    assert "(Blackwell or newer) require open modules" in choice.reason


@pytest.mark.parametrize("requested", ["auto", "proprietary"])
@pytest.mark.parametrize("branch", [595, 610])
def test_gpus_without_gsp_are_refused_by_branches_after_580(requested: str, branch: int) -> None:
    """Maxwell, Pascal and Volta are the 580 branch's legacy GPUs: a 595 or 610 driver (the
    GPU Operator's default is 595.91.07) does not drive them, so nothing is built for them."""
    with pytest.raises(DriverError, match=rf"^driver branch {branch} does not support .*10de:1db1"):
        resolve_module_type(requested, branch, [gpu(V100), gpu(V100)])
    assert resolve_module_type(requested, 580, [gpu(V100)]).module_type == "proprietary"


def config(**env: str) -> DriverConfig:
    return DriverConfig.from_env({"DRIVER_VERSION": "580.105.08", "TARGETARCH": "amd64", **env})


def test_configuration_from_the_operator_environment() -> None:
    parsed = config(
        OPEN_KERNEL_MODULES_ENABLED="true",
        DRIVER_CONFIG_DIGEST="abc",
        GPU_DIRECT_RDMA_ENABLED="True",
        USE_HOST_MOFED="false",
        NVFM_CONFIG_FABRIC_MODE="1",
    )
    assert parsed.kernel_module_type == "open"
    assert parsed.driver_branch == 580
    assert parsed.target_arch == "amd64"
    assert parsed.gpu_direct_rdma
    assert not parsed.use_host_mofed
    assert parsed.fabricmanager_overrides == {"FABRIC_MODE": "1"}


def test_kernel_module_type_wins_over_the_legacy_flag() -> None:
    parsed = config(KERNEL_MODULE_TYPE="proprietary", OPEN_KERNEL_MODULES_ENABLED="true")
    assert parsed.kernel_module_type == "proprietary"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TARGETARCH": "riscv64"}, "invalid value for TARGETARCH: 'riscv64' (accepted: amd64, "),
        ({"DRIVER_BRANCH": "570"}, "invalid value for DRIVER_BRANCH: '570' (accepted: 580"),
        ({"DRIVER_VERSION": "latest"}, "invalid value for DRIVER_VERSION: 'latest'"),
        ({"GPU_DIRECT_RDMA_ENABLED": "maybe"}, "GPU_DIRECT_RDMA_ENABLED: 'maybe' (accepted: true"),
        ({"NVFM_CONFIG_fabric": "1"}, "invalid value for NVFM_CONFIG_fabric"),
        ({"MAX_THREADS": "many"}, "invalid value for MAX_THREADS"),
    ],
)
def test_invalid_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(DriverError) as caught:
        config(**env)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
