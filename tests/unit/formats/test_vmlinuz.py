from __future__ import annotations

import gzip
import lzma
from pathlib import Path

import pytest
from tools import require
from vmlinuz_images import (
    COMPRESSORS,
    FLATCAR_BANNER,
    FLATCAR_RELEASE,
    TEMPLATE_BANNERS,
    arm64_image,
    bzimage,
    bzimage_payload,
    compress,
    filler,
    run_tool,
    vmlinux,
    zboot,
    zboot_payload,
)

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.formats.vmlinuz import (
    kernel_banner,
    kernel_banner_from_file,
    real_banners,
)
from nvidia_driver.naming import banner_release

DEBIAN_BANNER = (
    "Linux version 6.1.0-53-cloud-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian "
    "12.2.0-14+deb12u1) 12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC "
    "Debian 6.1.187-1 (2026-09-07)"
)


@pytest.fixture
def no_tools(tmp_path: Path) -> Commands:
    """Commands whose PATH holds no decompressor."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    return Commands(env={"PATH": str(empty)})


# --- banners ---------------------------------------------------------------------------------


def test_the_flatcar_banner_is_a_real_banner() -> None:
    assert list(real_banners(FLATCAR_BANNER.encode() + b"\n")) == [FLATCAR_BANNER]
    assert banner_release(FLATCAR_BANNER) == FLATCAR_RELEASE


@pytest.mark.parametrize("template", TEMPLATE_BANNERS)
def test_template_banners_are_skipped(template: str) -> None:
    assert list(real_banners(template.encode() + b"\0")) == []


def test_banner_ends_at_the_first_nul_or_newline() -> None:
    data = b"junk" + FLATCAR_BANNER.encode() + b"\0more" + DEBIAN_BANNER.encode() + b"\ntail"
    assert list(real_banners(data)) == [FLATCAR_BANNER, DEBIAN_BANNER]


def test_banner_release_rejects_what_is_not_a_banner() -> None:
    with pytest.raises(DriverError, match="not a kernel banner"):
        banner_release(TEMPLATE_BANNERS[0])


# --- x86 bzImage -----------------------------------------------------------------------------


@pytest.mark.parametrize("compression", COMPRESSORS)
def test_bzimage_with_each_compression(compression: str) -> None:
    image = bzimage(bzimage_payload(compression, vmlinux()))
    assert kernel_banner(image) == FLATCAR_BANNER
    assert kernel_banner(image, kernel_release=FLATCAR_RELEASE) == FLATCAR_BANNER


def test_bzimage_setup_sects_zero_means_four() -> None:
    image = bzimage(bzimage_payload("xz", vmlinux()), setup_sects=0)
    assert kernel_banner(image) == FLATCAR_BANNER


def test_corrupt_bzimage_payload_is_explained() -> None:
    payload = bytearray(bzimage_payload("gzip", vmlinux()))
    payload[10:200] = bytes(190)
    with pytest.raises(DriverError, match=r"not recognised \(bzImage payload: gzip: .*\)"):
        kernel_banner(bzimage(bytes(payload)))


def test_kernel_release_picks_the_matching_banner() -> None:
    kernel = vmlinux(DEBIAN_BANNER) + vmlinux()
    image = bzimage(bzimage_payload("gzip", kernel))
    assert kernel_banner(image) == DEBIAN_BANNER
    assert kernel_banner(image, kernel_release=FLATCAR_RELEASE) == FLATCAR_BANNER


def test_other_kernel_release_is_reported() -> None:
    image = bzimage(bzimage_payload("xz", vmlinux()))
    with pytest.raises(DriverError) as caught:
        kernel_banner(image, kernel_release="6.12.102-flatcar", source="flatcar.vmlinuz")
    message = str(caught.value)
    assert message.startswith("flatcar.vmlinuz is kernel 6.12.81-flatcar, not 6.12.102-flatcar")
    assert "\n" not in message


def test_missing_decompressor_is_named(no_tools: Commands) -> None:
    require("zstd")
    image = bzimage(bzimage_payload("zstd", vmlinux()))
    with pytest.raises(DriverError, match="zstd not found on PATH"):
        kernel_banner(image, commands=no_tools)


def test_stdlib_formats_need_no_command(no_tools: Commands) -> None:
    for compression in ("gzip", "bzip2", "lzma", "xz"):
        image = bzimage(bzimage_payload(compression, vmlinux()))
        assert kernel_banner(image, commands=no_tools) == FLATCAR_BANNER


# --- arm64 -----------------------------------------------------------------------------------


def test_arm64_image() -> None:
    assert kernel_banner(arm64_image(vmlinux())) == FLATCAR_BANNER


def test_arm64_image_gz() -> None:
    assert kernel_banner(gzip.compress(arm64_image(vmlinux()))) == FLATCAR_BANNER


@pytest.mark.parametrize("compression", ["gzip", "xz", "zstd", "lz4"])
def test_efi_zboot(compression: str) -> None:
    image = zboot(zboot_payload(compression, arm64_image(vmlinux())), compression)
    assert kernel_banner(image, kernel_release=FLATCAR_RELEASE) == FLATCAR_BANNER


# --- unknown containers ----------------------------------------------------------------------


@pytest.mark.parametrize("compression", COMPRESSORS)
def test_scan_finds_a_stream_in_an_unknown_container(compression: str) -> None:
    stream = compress(compression, vmlinux())
    image = filler(3000, seed=9) + stream + filler(5000, seed=10)
    assert kernel_banner(image) == FLATCAR_BANNER


@pytest.mark.parametrize(
    "options",
    [["--no-check"], ["--stream-size=5600"], ["-1", "--no-check", "--stream-size=5600"]],
)
def test_scan_cuts_zstd_frames_of_every_header_shape(options: list[str]) -> None:
    # zstd refuses trailing bytes, so the frames are measured before it sees them; the
    # banner straddles the two frames.
    kernel = vmlinux()
    first = run_tool("zstd", "-c", *options, data=kernel[:5600])
    frames = first + run_tool("zstd", "-c", data=kernel[5600:])
    image = filler(100) + frames + filler(100)
    assert kernel_banner(image) == FLATCAR_BANNER


def test_scan_skips_streams_that_do_not_decompress() -> None:
    decoy = b"\x1f\x8b\x08" + filler(100) + b"\xfd7zXZ\x00" + filler(100)
    image = decoy + lzma.compress(vmlinux(), format=lzma.FORMAT_XZ) + filler(100)
    assert kernel_banner(image) == FLATCAR_BANNER


def test_uncompressed_vmlinux() -> None:
    assert kernel_banner(vmlinux()) == FLATCAR_BANNER


def test_unrecognised_image_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "vmlinuz"
    path.write_bytes(filler(100_000) + b"".join(t.encode() + b"\0" for t in TEMPLATE_BANNERS))
    with pytest.raises(DriverError) as caught:
        kernel_banner_from_file(path)
    message = str(caught.value)
    assert message.startswith(f"no kernel banner found in {path}: ")
    assert "format/compression was not recognised" in message
    assert "\n" not in message


def test_unreadable_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(DriverError, match=r"cannot read kernel image .*missing"):
        kernel_banner_from_file(tmp_path / "missing")


def test_banner_from_file(tmp_path: Path) -> None:
    path = tmp_path / "flatcar_production_image.vmlinuz"
    path.write_bytes(bzimage(bzimage_payload("xz", vmlinux())))
    assert kernel_banner_from_file(path, kernel_release=FLATCAR_RELEASE) == FLATCAR_BANNER
