"""The vocabulary's grammars against NVIDIA's, Flatcar's and the kernel's real spellings."""

from __future__ import annotations

import pytest

from nvidia_driver.errors import DriverError
from nvidia_driver.naming import (
    DRIVER_VERSION_RE,
    FLATCAR_VERSION_RE,
    KERNEL_RELEASE_RE,
    arch_of,
    driver_branch,
    driver_url,
    run_name,
)


# Production, new feature and LTS branches (versions.toml), a beta, a legacy two-part release.
@pytest.mark.parametrize(
    "version", ["535.261.03", "570.195.03", "580.105.08", "610.57.04", "575.51.02", "390.157"]
)
def test_nvidias_driver_versions_are_driver_versions(version: str) -> None:
    assert DRIVER_VERSION_RE.fullmatch(version)
    assert driver_branch(version) == int(version[:3])


@pytest.mark.parametrize(
    "text", ["580", "r580", "580.178.04x", "58.1.2", "580.1.2.3", "5\uff180.1.2"]
)
def test_what_is_not_a_driver_version_is_refused(text: str) -> None:
    assert not DRIVER_VERSION_RE.fullmatch(text)
    with pytest.raises(DriverError, match="invalid driver version"):
        driver_branch(text)


def test_flatcar_and_kernel_spellings() -> None:
    assert FLATCAR_VERSION_RE.fullmatch("4593.2.5")
    assert not FLATCAR_VERSION_RE.fullmatch("4593.2")
    for release in ("6.12.102", "6.12.102-flatcar", "6.12.95+deb12-cloud-amd64", "6.2"):
        assert KERNEL_RELEASE_RE.fullmatch(release)
    assert not KERNEL_RELEASE_RE.fullmatch("6.12.102 flatcar")


def test_file_names_and_arches() -> None:
    assert run_name("580.105.08", "arm64") == "NVIDIA-Linux-aarch64-580.105.08.run"
    assert driver_url("https://h/tesla/", "580.105.08", "amd64") == (
        "https://h/tesla/580.105.08/NVIDIA-Linux-x86_64-580.105.08.run"
    )
    assert [arch_of(name) for name in ("x86_64", "aarch64", "amd64")] == ["amd64", "arm64", "amd64"]
    with pytest.raises(DriverError, match="unsupported architecture 'x86_64'"):
        run_name("580.105.08", "x86_64")
