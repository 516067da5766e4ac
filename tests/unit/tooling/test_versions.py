"""versions.toml: the supported drivers, their .run checksums, channels and arches."""

from __future__ import annotations

from typing import Any

import pytest

from gdc.versions import (
    VERSIONS_FILE,
    VersionsError,
    driver_branch,
    load_versions,
    parse_versions,
)

SUM = "ab" * 32


def _data(**drivers: Any) -> dict[str, Any]:
    return {
        "images": {"channels": ["stable", "lts"], "arches": ["amd64"]},
        "drivers": drivers or {"580.178.04": {"sha256": {"amd64": SUM, "arm64": "TODO"}}},
    }


def test_the_repository_file_lists_the_active_datacenter_branches() -> None:
    versions = load_versions(VERSIONS_FILE)
    assert [d.version for d in versions.drivers] == ["580.178.04", "595.91.07", "610.57.04"]
    assert versions.newest.version == "610.57.04"
    assert set(versions.arches) == {"amd64", "arm64"}
    assert "stable" in versions.channels


def test_every_listed_driver_has_its_checksums_recorded() -> None:
    """invoke build, the workflows and nightly need no --driver-sha256 for a listed driver."""
    versions = load_versions()
    for driver in versions.drivers:
        for arch in versions.arches:
            assert len(driver.checksum(arch)) == 64, (driver.version, arch)
    # The x86_64 580.178.04 .run as NVIDIA serves it (nixpkgs and other packagers agree).
    assert versions.driver("580.178.04").checksum("amd64").startswith("5975a86ee45bffcb")


def test_a_missing_checksum_says_how_to_supply_one() -> None:
    driver = parse_versions(_data()).driver("580.178.04")
    assert driver.checksum("amd64") == SUM
    with pytest.raises(VersionsError, match=r"arm64: `invoke record-driver 580\.178\.04` .*"
                                            r" into versions\.toml$"):  # fmt: skip
        driver.checksum("arm64")


def test_drivers_sort_numerically_and_a_branch_names_its_driver() -> None:
    versions = parse_versions(
        _data(**{
            "1000.1.2": {"sha256": {}},
            "580.105.08": {"sha256": {}},
            "570.195.03": {"sha256": {}},
        })
    )  # fmt: skip
    assert [d.version for d in versions.drivers] == ["570.195.03", "580.105.08", "1000.1.2"]
    assert versions.driver("580").version == "580.105.08"
    assert versions.driver("580.105.08").branch == "580"
    with pytest.raises(VersionsError, match=r"both branch 580: keep one driver per branch"):
        parse_versions(_data(**{"580.95.05": {"sha256": {}}, "580.105.08": {"sha256": {}}}))
    with pytest.raises(VersionsError, match=r"driver 999 is not in versions.toml"):
        versions.driver("999")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"drivers": {}}, "no \\[drivers"),
        ({"drivers": {"580.1": {"sha256": {"amd64": "beef"}}}}, "64 hex digits or 'TODO'"),
        ({"drivers": {"580.1": {"sha256": {"riscv": SUM}}}}, "unknown arch 'riscv'"),
        ({"drivers": {"latest": {}}}, "invalid driver version 'latest'"),
        ({"images": {"channels": ["edge"]}, "drivers": {"580.1": {}}}, "unknown edge"),
        ({"images": {"arches": []}, "drivers": {"580.1": {}}}, "non-empty list"),
        (
            {"images": {"arches": ["amd64", "arm64", "amd64"]}, "drivers": {"580.1": {}}},
            "images.arches: amd64 is listed twice",
        ),
        (
            {"images": {"channels": ["stable", "stable"]}, "drivers": {"580.1": {}}},
            "images.channels: stable is listed twice",
        ),
    ],
)
def test_a_broken_versions_file_is_refused(data: dict[str, Any], message: str) -> None:
    with pytest.raises(VersionsError, match=message):
        parse_versions(data)


def test_branch_of_a_driver_version() -> None:
    assert driver_branch("595.91.07") == "595"
    with pytest.raises(VersionsError):
        driver_branch("r580")


def test_an_unreadable_file_names_itself(tmp_path: Any) -> None:
    broken = tmp_path / "versions.toml"
    broken.write_text("[drivers\n")
    with pytest.raises(VersionsError, match=r"cannot read .*versions.toml"):
        load_versions(broken)


def test_pinned_flatcar_releases_are_listed_and_checked() -> None:
    data = _data()
    data["images"]["pinned"] = ["4593.2.0", "4081.3.10", "4593.2.0"]
    assert parse_versions(data).pinned == ("4593.2.0", "4081.3.10")
    assert parse_versions(_data()).pinned == ()
    data["images"]["pinned"] = ["stable"]
    with pytest.raises(VersionsError, match=r"images.pinned: stable is not a Flatcar version"):
        parse_versions(data)
    data["images"]["pinned"] = "4593.2.0"
    with pytest.raises(VersionsError, match=r"images.pinned must be a list of Flatcar versions"):
        parse_versions(data)


def test_the_repository_file_covers_every_channel() -> None:
    assert set(load_versions().channels) == {"stable", "beta", "alpha", "lts"}


def test_every_driver_records_its_redist_archives() -> None:
    """The fabric manager and NSCQ digests are recorded; the rest are TODO, never guessed."""
    for driver in load_versions().drivers:
        components = {archive.component: archive for archive in driver.redist}
        assert set(components) == {"fabricmanager", "libnvidia_nscq", "nvlsm", "imex", "libnvsdm"}
        for key in ("fabricmanager", "libnvidia_nscq"):
            assert components[key].version == driver.version
            assert all(value is not None for value in components[key].sha256.values())
        assert set(components["libnvsdm"].sha256) == {"amd64"}  # NVIDIA ships it for amd64
        assert driver.redist_checksums("arm64").keys() == {
            "fabricmanager.arm64", "libnvidia_nscq.arm64", "nvlsm.arm64", "imex.arm64"
        }  # fmt: skip


@pytest.mark.parametrize(
    ("redist", "message"),
    [
        ({"nvlsm": {"version": "2025.06.11", "riscv": SUM}}, "unknown arch 'riscv'"),
        ({"nvlsm": {"amd64": SUM}}, r"nvlsm\.version: expected a version or 'TODO'"),
        ({"nvlsm": {"version": "2025.06.11", "amd64": "abc"}}, "expected 64 hex digits or 'TODO'"),
        ({"Bad-Name": {"version": "1", "amd64": SUM}}, r"Bad-Name: expected \{ version"),
    ],
)
def test_malformed_redist_records_are_refused(redist: dict[str, Any], message: str) -> None:
    entry = {"sha256": {"amd64": SUM}, "redist": redist}
    with pytest.raises(VersionsError, match=message):
        parse_versions(_data(**{"580.178.04": entry}))
