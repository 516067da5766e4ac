from __future__ import annotations

import hashlib
import os
import stat
import tarfile
from pathlib import Path

import pytest
from runfile_builder import (
    VERSION,
    Compression,
    build_run,
    compress,
    compression_params,
    needs_zstd,
    posix_cksum,
    tar_of,
    tar_of_members,
    write_run,
)

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.image import runfile
from nvidia_driver.image.runfile import (
    PosixCksum,
    extract,
    line_offset,
    payload_offset,
    read_header,
    sniff_compression,
    verify,
)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A tiny driver-like tree: a top-level binary, a library, a nested source file."""
    root = tmp_path / "tree"
    (root / "kernel" / "nvidia").mkdir(parents=True)
    (root / "nvidia-smi").write_bytes(b"\x7fELF fake nvidia-smi\n")
    (root / "nvidia-smi").chmod(0o755)
    (root / f"libcuda.so.{VERSION}").write_bytes(b"\x7fELF fake libcuda\n" * 100)
    (root / "kernel" / "nvidia" / "nv.c").write_text("int nv;\n")
    (root / "kernel" / "nvidia" / "nv.c").chmod(0o644)
    (root / ".manifest").write_text(f"NVIDIA\n{VERSION}\n")
    return root


def unpacked(tree: Path) -> dict[str, tuple[bytes | None, int]]:
    """Relative path -> (content or None for a directory, permission bits)."""
    found: dict[str, tuple[bytes | None, int]] = {}
    for path in sorted(tree.rglob("*")):
        content = None if path.is_dir() else path.read_bytes()
        found[path.relative_to(tree).as_posix()] = (content, stat.S_IMODE(path.stat().st_mode))
    return found


# --- POSIX cksum -------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65_537, 1_000_003])
def test_posix_cksum_matches_coreutils(size: int) -> None:
    data = os.urandom(size)
    crc = PosixCksum()
    crc.update(data[: size // 3])
    crc.update(data[size // 3 :])
    assert crc.value() == posix_cksum(data)


# --- header ------------------------------------------------------------------------------------


def test_header_fields_are_parsed_by_name_with_quotes_stripped(tmp_path: Path, tree: Path) -> None:
    built = build_run(tmp_path / "x.run", tree)
    header = read_header(built.path)
    assert header.skip == built.skip
    assert header.version == VERSION
    assert header.target_arch == "x86_64"
    assert (
        header.fields["label"] == f"NVIDIA Accelerated Graphics Driver for Linux-x86_64 {VERSION}"
    )
    assert header.fields["TMPROOT"] == "${TMPDIR:=/tmp}"
    assert header.crc is not None
    assert header.md5 is not None


def test_header_ends_at_the_first_line_that_is_not_key_value(tmp_path: Path, tree: Path) -> None:
    # The stub has "skip=99999" and "CRCsum=1" after its comment banner: not header lines.
    built = build_run(tmp_path / "x.run", tree)
    assert read_header(built.path).skip == built.skip != 99999


def test_header_order_does_not_matter(tmp_path: Path) -> None:
    # A 1.0-era header put skip= on line 2, before CRCsum and MD5 (single quotes are stripped
    # as double ones are).
    path = tmp_path / "old.run"
    path.write_bytes(b'#! /bin/sh\nskip=7\nCRCsum=123\nMD5="' + b"a" * 32 + b'"\nlabel=x\n'
                     b"TARGET_ARCH='ia64'\n\n")  # fmt: skip
    header = read_header(path)
    assert (header.skip, header.crc, header.md5) == (7, 123, "a" * 32)
    assert header.target_arch == "ia64"


def test_an_all_zero_md5_means_no_md5(tmp_path: Path, tree: Path) -> None:
    built = build_run(tmp_path / "x.run", tree)
    text = built.path.read_bytes()
    md5 = read_header(built.path).md5
    assert md5 is not None
    built.path.write_bytes(text.replace(md5.encode(), b"0" * 32))
    assert read_header(built.path).md5 is None


@pytest.mark.parametrize(
    "head",
    [b"#! /bin/sh\nCRCsum=1\nlabel=x\n", b"#! /bin/sh\nskip=abc\n", b"\x7fELF\x02\x01"],
    ids=["no-skip", "skip-not-a-number", "not-a-script"],
)
def test_a_header_without_a_valid_skip_is_refused(tmp_path: Path, head: bytes) -> None:
    path = tmp_path / "bad.run"
    path.write_bytes(head)
    with pytest.raises(DriverError, match="no valid skip="):
        read_header(path)


def test_a_malformed_crc_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.run"
    path.write_bytes(b"#! /bin/sh\nCRCsum=12ab\nskip=3\n")
    with pytest.raises(DriverError, match="malformed CRCsum"):
        read_header(path)


def test_an_unreadable_file_is_a_driver_error(tmp_path: Path) -> None:
    with pytest.raises(DriverError, match="cannot read"):
        read_header(tmp_path / "missing.run")


# --- payload offset and compression --------------------------------------------------------------


@pytest.mark.parametrize("chunk_bytes", [1, 7, 1 << 20])
def test_payload_offset_is_after_skip_minus_one_newlines(
    tmp_path: Path, tree: Path, chunk_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runfile, "CHUNK_BYTES", chunk_bytes)  # newlines across chunk edges
    built = build_run(tmp_path / "x.run", tree, "gzip")
    data = built.path.read_bytes()
    assert payload_offset(built.path) == built.payload_offset
    assert data[: built.payload_offset].count(b"\n") == built.skip - 1
    assert data[built.payload_offset : built.payload_offset + 2] == b"\x1f\x8b"


def test_line_offsets(tmp_path: Path) -> None:
    path = tmp_path / "lines"
    path.write_bytes(b"a\nbb\n\nccc")
    assert [line_offset(path, line) for line in (1, 2, 3, 4)] == [0, 2, 5, 6]


def test_a_file_shorter_than_skip_is_truncated(tmp_path: Path) -> None:
    path = tmp_path / "short.run"
    path.write_bytes(b"#! /bin/sh\nskip=40\nline\n")
    with pytest.raises(DriverError, match="truncated"):
        payload_offset(path)


@pytest.mark.parametrize("compression", compression_params())
def test_the_compression_is_sniffed_at_the_payload(
    tmp_path: Path, tree: Path, compression: Compression
) -> None:
    built = build_run(tmp_path / "x.run", tree, compression)
    assert sniff_compression(built.path, built.payload_offset) == compression


def test_an_unknown_payload_format_is_refused(tmp_path: Path) -> None:
    built = write_run(tmp_path / "x.run", b"BZh91AY&SY not a format we read")
    with pytest.raises(DriverError, match="not zstd, xz or gzip"):
        sniff_compression(built.path, built.payload_offset)


# --- checksums ---------------------------------------------------------------------------------


def _verify(path: Path, sha256: str | None = None) -> None:
    header = read_header(path)
    verify(path, header, payload_offset(path, header), sha256)


def test_the_header_crc_and_md5_cover_line_4_to_eof(tmp_path: Path, tree: Path) -> None:
    built = build_run(tmp_path / "x.run", tree)
    data = built.path.read_bytes()
    covered = data.split(b"\n", 3)[3]
    header = read_header(built.path)
    assert header.crc == posix_cksum(covered)
    assert header.md5 == hashlib.md5(covered, usedforsecurity=False).hexdigest()
    _verify(built.path)


def test_a_crc_mismatch_is_an_error(tmp_path: Path, tree: Path) -> None:
    built = write_run(tmp_path / "x.run", compress(tar_of(tree), "xz"), crc_delta=1)
    with pytest.raises(DriverError, match=r"corrupt: its CRC is \d+ but its header says \d+"):
        _verify(built.path)


def test_an_md5_mismatch_is_an_error(tmp_path: Path, tree: Path) -> None:
    built = write_run(tmp_path / "x.run", compress(tar_of(tree), "xz"), md5="f" * 32)
    with pytest.raises(
        DriverError, match=r"corrupt: its MD5 is [0-9a-f]{32} but its header says f"
    ):
        _verify(built.path)


def test_a_corrupted_byte_fails_the_check(tmp_path: Path, tree: Path) -> None:
    built = build_run(tmp_path / "x.run", tree)
    data = bytearray(built.path.read_bytes())
    data[-10] ^= 0xFF
    built.path.write_bytes(bytes(data))
    with pytest.raises(DriverError, match="corrupt"):
        _verify(built.path)


def test_checksums_over_the_payload_alone_are_accepted(tmp_path: Path, tree: Path) -> None:
    # The range is verified for makeself nv2 only; later nvN may cover the payload alone.
    built = write_run(tmp_path / "x.run", compress(tar_of(tree), "xz"), checksums="payload")
    _verify(built.path)


def test_a_file_without_crc_or_md5_is_not_checked(tmp_path: Path, tree: Path) -> None:
    built = write_run(tmp_path / "x.run", compress(tar_of(tree), "xz"), checksums="none")
    header = read_header(built.path)
    assert (header.crc, header.md5) == (None, None)
    _verify(built.path)


def test_the_pinned_sha256_is_checked(tmp_path: Path, tree: Path) -> None:
    built = build_run(tmp_path / "x.run", tree)
    digest = hashlib.sha256(built.path.read_bytes()).hexdigest()
    _verify(built.path, digest.upper())
    with pytest.raises(DriverError, match=f"not the pinned {'0' * 64}"):
        _verify(built.path, "0" * 64)


def test_a_malformed_sha256_pin_is_refused(tmp_path: Path, tree: Path) -> None:
    built = build_run(tmp_path / "x.run", tree)
    with pytest.raises(DriverError, match=r"is not a SHA-256 \(64 hex digits\).*fix the pin"):
        _verify(built.path, "sha256:abc")


# --- extraction --------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", compression_params())
def test_extract_unpacks_the_tree(tmp_path: Path, tree: Path, compression: Compression) -> None:
    built = build_run(tmp_path / "x.run", tree, compression)
    digest = hashlib.sha256(built.path.read_bytes()).hexdigest()
    dest = extract(built.path, tmp_path / "out", sha256=digest)
    assert dest == tmp_path / "out"
    assert unpacked(dest) == unpacked(tree)
    assert unpacked(dest)["nvidia-smi"][1] == 0o755


def test_extract_checks_before_unpacking(tmp_path: Path, tree: Path) -> None:
    built = write_run(tmp_path / "x.run", compress(tar_of(tree), "xz"), crc_delta=1)
    with pytest.raises(DriverError, match="CRC"):
        extract(built.path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_extract_refuses_a_non_empty_destination(tmp_path: Path, tree: Path) -> None:
    built = build_run(tmp_path / "x.run", tree)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("mine\n")
    with pytest.raises(DriverError, match="not empty"):
        extract(built.path, tmp_path / "out")
    assert (tmp_path / "out" / "keep").read_text() == "mine\n"


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o644
    return info


UNSAFE_MEMBERS = {
    "absolute-path": [(_member("/tmp/gdc-evil"), b"x")],
    "dot-dot": [(_member("./../evil"), b"x")],
    "symlink-out": [(_member("./out", tarfile.SYMTYPE, "/etc"), b"")],
    "symlink-up": [(_member("./up", tarfile.SYMTYPE, "../../.."), b"")],
    "hardlink-out": [(_member("./passwd", tarfile.LNKTYPE, "/etc/passwd"), b"")],
    "device": [(_member("./dev", tarfile.CHRTYPE), b"")],
    "block-device": [(_member("./sda", tarfile.BLKTYPE), b"")],
    "fifo": [(_member("./fifo", tarfile.FIFOTYPE), b"")],
    "hardlink-up": [(_member("./passwd", tarfile.LNKTYPE, "../../../etc/passwd"), b"")],
    # Each link is fine as text; together they climb out: "a/b" is the root, "a/b/.." above it.
    "symlink-chain-out": [
        (_member("./a", tarfile.DIRTYPE), b""),
        (_member("./a/b", tarfile.SYMTYPE, ".."), b""),
        (_member("./c", tarfile.SYMTYPE, "a/b/.."), b""),
    ],
    "fifo-named-with-a-line-break": [(_member("./fifo\nERROR: x", tarfile.FIFOTYPE), b"")],
    # Stricter than the "data" filter, which failed on the first with a KeyError and linked
    # the directory.
    "hardlink-to-nothing": [(_member("./copy", tarfile.LNKTYPE, "./missing"), b"")],
    "hardlink-to-a-directory": [
        (_member("./kernel", tarfile.DIRTYPE), b""),
        (_member("./copy", tarfile.LNKTYPE, "./kernel"), b""),
    ],
}
# What each refusal says: the reason after "refusing to unpack the driver package: it has".
REFUSALS = {
    "absolute-path": r"a member that would land outside the extraction directory \('/tmp/gdc",
    "dot-dot": r"a member that would land outside the extraction directory \('\./\.\./evil'\)",
    "symlink-out": r"a link to an absolute path \(\./out -> /etc\)",
    "symlink-up": r"a symbolic link out of the extraction directory \(\./up -> \.\./\.\./\.\.\)",
    "hardlink-out": r"a link to an absolute path \(\./passwd -> /etc/passwd\)",
    "device": r"a device, fifo or other special file \(\./dev\)",
    "block-device": r"a device, fifo or other special file \(\./sda\)",
    "fifo": r"a device, fifo or other special file \(\./fifo\)",
    "fifo-named-with-a-line-break": r"a device, fifo or other special file \(\./fifo\\nERROR: x\)",
    "hardlink-up": r"a member that would land outside the extraction directory \('\.\./",
    "symlink-chain-out": r"a symbolic link that resolves out of the extraction directory \(c -> ",
    "hardlink-to-nothing": r"a hard link to what it has not unpacked as a file before",
    "hardlink-to-a-directory": r"a hard link to what it has not unpacked as a file before",
}


@pytest.mark.parametrize("members", UNSAFE_MEMBERS.values(), ids=UNSAFE_MEMBERS.keys())
def test_unsafe_members_are_refused(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]]
) -> None:
    safe = [(_member("./nvidia-smi"), b"fine\n")]
    built = write_run(tmp_path / "x.run", compress(tar_of_members(safe + members), "gzip"))
    with pytest.raises(DriverError, match="refusing to unpack") as refused:
        extract(built.path, tmp_path / "out" / "tree")
    assert "\n" not in str(refused.value)
    assert str(refused.value).endswith("it is not a genuine NVIDIA .run")
    assert not (tmp_path / "out" / "tree").exists()
    assert not (tmp_path / "out" / "evil").exists()
    assert not Path("/tmp/gdc-evil").exists()


@pytest.mark.parametrize("case", UNSAFE_MEMBERS)
def test_each_refusal_says_what_it_refused(tmp_path: Path, case: str) -> None:
    built = write_run(tmp_path / "x.run", compress(tar_of_members(UNSAFE_MEMBERS[case]), "xz"))
    prefix = "refusing to unpack the driver package: it has "
    with pytest.raises(DriverError, match=prefix + REFUSALS[case]):
        extract(built.path, tmp_path / "out")


def test_nothing_is_written_through_a_link(tmp_path: Path) -> None:
    # Stricter than the "data" filter, which wrote lib/evil through lib, to ./evil.
    members = [(_member("./lib", tarfile.SYMTYPE, "."), b""), (_member("./lib/evil"), b"x")]
    built = write_run(tmp_path / "x.run", compress(tar_of_members(members), "xz"))
    with pytest.raises(
        DriverError,
        match=r"lib is a symbolic link in the extracted tree: refusing to write through it; it is "
        r"not a genuine NVIDIA \.run",
    ):
        extract(built.path, tmp_path / "out" / "tree")
    assert not (tmp_path / "out" / "tree").exists()


def test_links_that_stay_inside_are_unpacked(tmp_path: Path) -> None:
    # What the "data" filter let through: relative symbolic links inside the tree, also to what
    # comes later, and hard links to a file unpacked before.
    members = [
        (_member("./kernel", tarfile.DIRTYPE), b""),
        (_member("./kernel/nv.c"), b"int nv;\n"),
        (_member("./kernel/nv-link.c", tarfile.SYMTYPE, "nv.c"), b""),
        (_member("./kernel/nv-hard.c", tarfile.LNKTYPE, "./kernel/nv.c"), b""),
        (_member("./libcuda.so.1", tarfile.SYMTYPE, f"libcuda.so.{VERSION}"), b""),
        (_member(f"./libcuda.so.{VERSION}"), b"\x7fELF"),
        (_member("./top", tarfile.SYMTYPE, "kernel/../libcuda.so.1"), b""),
    ]
    built = write_run(tmp_path / "x.run", compress(tar_of_members(members), "xz"))
    dest = extract(built.path, tmp_path / "out")
    assert (dest / "kernel/nv-link.c").readlink() == Path("nv.c")
    assert (dest / "kernel/nv-hard.c").stat().st_ino == (dest / "kernel/nv.c").stat().st_ino
    assert (dest / "libcuda.so.1").read_bytes() == (dest / "top").read_bytes() == b"\x7fELF"


def test_extraction_drops_setuid_bits(tmp_path: Path) -> None:
    # Python's "data" filter: install modes come from the .manifest instead.
    member = _member("./nvidia-modprobe")
    member.mode = 0o4755
    built = write_run(tmp_path / "x.run", compress(tar_of_members([(member, b"bin\n")]), "xz"))
    dest = extract(built.path, tmp_path / "out")
    assert stat.S_IMODE((dest / "nvidia-modprobe").stat().st_mode) == 0o755


# The modes Python's "data" filter gives files (CPython Lib/tarfile.py, _get_filtered_attrs):
# no high bits or group and other write; no execute unless the owner's; owner read and write.
DATA_FILTER_MODES = {
    0o4755: 0o755, 0o2711: 0o711, 0o1777: 0o755, 0o666: 0o644, 0o640: 0o640,
    0o070: 0o640, 0o000: 0o600, 0o100: 0o700, 0o511: 0o711,
}  # fmt: skip


@pytest.mark.parametrize(("mode", "expected"), DATA_FILTER_MODES.items(), ids=oct)
def test_file_modes_are_the_data_filter_s(tmp_path: Path, mode: int, expected: int) -> None:
    member = _member("./file")
    member.mode = mode
    built = write_run(tmp_path / "x.run", compress(tar_of_members([(member, b"x")]), "xz"))
    dest = extract(built.path, tmp_path / "out")
    assert stat.S_IMODE((dest / "file").stat().st_mode) == expected


@pytest.mark.parametrize("compression", ["gzip", "xz"])
def test_a_damaged_payload_is_a_driver_error(
    tmp_path: Path, tree: Path, compression: Compression
) -> None:
    payload = compress(tar_of(tree), compression)
    damaged = payload[: len(payload) // 2]  # no checksums to catch it first
    built = write_run(tmp_path / "x.run", damaged, checksums="none")
    with pytest.raises(DriverError, match="unpacking the driver package failed"):
        extract(built.path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@needs_zstd
def test_a_damaged_zstd_payload_reports_zstd_s_reason(tmp_path: Path, tree: Path) -> None:
    payload = compress(tar_of(tree), "zstd")
    built = write_run(tmp_path / "x.run", payload[: len(payload) // 2], checksums="none")
    with pytest.raises(
        DriverError, match=r"zstd failed \(exit 1\): .*(premature end|unexpected end|truncated)"
    ):
        extract(built.path, tmp_path / "out")


@needs_zstd
def test_zstd_needs_the_zstd_command(tmp_path: Path, tree: Path) -> None:
    built = build_run(tmp_path / "x.run", tree, "zstd")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    with pytest.raises(DriverError, match="zstd not found on PATH"):
        extract(built.path, tmp_path / "out", commands=Commands(env={"PATH": str(empty)}))
