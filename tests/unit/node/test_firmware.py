"""The GSP firmware: copied from the image into the Operator's /lib/firmware mount."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvidia_driver.errors import DriverError
from nvidia_driver.node.modparams import (
    FIRMWARE_SEARCH_PATH,
    configure_firmware_search_path,
    provide_gsp_firmware,
)
from nvidia_driver.paths import Paths

V = "580.105.08"
COPYING = f"Copying the GSP firmware into /lib/firmware/nvidia/{V}..."


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    paths = Paths(tmp_path)
    image = paths.image_firmware(V)
    image.mkdir(parents=True)
    (image / "gsp_ga10x.bin").write_bytes(b"ga10x" * 1000)
    (image / "gsp_tu10x.bin").write_bytes(b"tu10x" * 1000)
    return paths


def test_the_firmware_is_copied_where_the_kernel_looks(
    paths: Paths, capsys: pytest.CaptureFixture[str]
) -> None:
    provide_gsp_firmware(paths, V, "open", [])
    copy = paths.firmware(V)
    assert (copy / "gsp_ga10x.bin").read_bytes() == b"ga10x" * 1000
    assert (copy / "gsp_tu10x.bin").read_bytes() == b"tu10x" * 1000
    assert (copy / "gsp_tu10x.bin").stat().st_mode & 0o777 == 0o644
    assert capsys.readouterr().out.splitlines() == [COPYING]
    assert sorted(p.name for p in copy.iterdir()) == ["gsp_ga10x.bin", "gsp_tu10x.bin"]


def test_a_current_copy_is_left_alone(paths: Paths, capsys: pytest.CaptureFixture[str]) -> None:
    provide_gsp_firmware(paths, V, "open", [])
    copied = paths.firmware(V) / "gsp_ga10x.bin"
    inode = copied.stat().st_ino
    capsys.readouterr()
    provide_gsp_firmware(paths, V, "open", [])
    assert capsys.readouterr().out == ""
    assert copied.stat().st_ino == inode


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: f.write_bytes(b"ga10x" * 999),  # truncated
        lambda f: f.write_bytes(b"GA10X" * 1000),  # same size, other bytes
        lambda f: f.unlink(),
    ],
    ids=["size", "content", "missing"],
)
def test_a_stale_or_missing_file_is_replaced_and_only_it(
    paths: Paths, capsys: pytest.CaptureFixture[str], damage: object
) -> None:
    provide_gsp_firmware(paths, V, "open", [])
    copy = paths.firmware(V)
    kept = (copy / "gsp_tu10x.bin").stat().st_ino
    assert callable(damage)
    damage(copy / "gsp_ga10x.bin")
    capsys.readouterr()
    provide_gsp_firmware(paths, V, "open", [])
    assert (copy / "gsp_ga10x.bin").read_bytes() == b"ga10x" * 1000
    assert (copy / "gsp_tu10x.bin").stat().st_ino == kept
    assert capsys.readouterr().out.splitlines() == [COPYING]
    assert not [p for p in copy.iterdir() if p.name.startswith(".")], "no temporary files left"


def test_disabled_gsp_needs_no_firmware(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    provide_gsp_firmware(paths, V, "proprietary", ["NVreg_EnableGpuFirmware=0"])
    assert not paths.firmware(V).exists()


def test_open_modules_without_firmware_in_the_image_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(DriverError) as caught:
        provide_gsp_firmware(Paths(tmp_path), V, "open", [])
    message = str(caught.value)
    assert f"no GSP firmware for driver {V} in /opt/lib/firmware/nvidia/{V}" in message
    assert "the open kernel modules need" in message


def test_proprietary_modules_without_firmware_in_the_image_warn_and_go_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    provide_gsp_firmware(Paths(tmp_path), V, "proprietary", [])
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith(f"WARNING: the image has no GSP firmware for driver {V}")
    assert "NVreg_EnableGpuFirmware=0" in line


def test_an_unwritable_destination_says_which_host_path(
    paths: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(DriverError) as caught:
        provide_gsp_firmware(paths, V, "open", [])
    assert str(caught.value) == (
        f"copying the GSP firmware into /lib/firmware/nvidia/{V} failed (Permission denied): "
        "the host path /run/nvidia/driver/lib/firmware must be writable"
    )


def test_the_search_path_a_previous_pod_set_is_not_warned_about(
    paths: Paths, capsys: pytest.CaptureFixture[str]
) -> None:
    """firmware_class.path outlives the pod: every later install finds its own value there."""
    search_path = paths.firmware_search_path
    search_path.parent.mkdir(parents=True)
    search_path.write_text(f"{FIRMWARE_SEARCH_PATH}\n")  # as the kernel shows it
    configure_firmware_search_path(paths, [])
    captured = capsys.readouterr()
    assert "WARNING" not in captured.out + captured.err
    assert "Retaining" not in captured.out
    assert search_path.read_text() == f"{FIRMWARE_SEARCH_PATH}\n"
