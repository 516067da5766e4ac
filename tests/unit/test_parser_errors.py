"""What fuzzing found: inputs that ended in ValueError, OverflowError or RecursionError.

Each parser now fails with DriverError, in one line. Digits are ASCII digits: ``str.isdigit()``
takes "²", and ``int()`` and ``\\d`` take the digits of every script.
"""

from __future__ import annotations

import io
import tarfile
import zlib
from pathlib import Path

import pytest
from kerneltree_fixtures import KERNEL, write

from nvidia_driver.config import DriverConfig
from nvidia_driver.errors import DriverError
from nvidia_driver.formats.vmlinuz import kernel_banner
from nvidia_driver.image.manifest import parse_manifest
from nvidia_driver.image.runfile import read_header
from nvidia_driver.kbuild import container, kerneltree
from nvidia_driver.kbuild.compiler import kernel_config, kernel_gcc_major
from nvidia_driver.naming import parse_kernel_release
from nvidia_driver.node.daemons import PERSISTENCED, read_pid
from nvidia_driver.node.host import module_refcounts
from nvidia_driver.paths import Paths
from nvidia_driver.sources.flatcar import FlatcarVersion

BUILD = f"usr/lib/modules/{KERNEL}/build"
SUPERSCRIPT_TWO = "\u00b2"  # "²": isdigit() says yes, int() says no
ARABIC_INDIC = str.maketrans(
    "0123456789", "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669"
)


def pax_archive(pax: dict[str, str], name: str = f"{BUILD}/Makefile") -> bytes:
    """One member preceded by a pax header with exactly these records, gzip-compressed."""
    header = tarfile.TarInfo._create_pax_generic_header(  # type: ignore[attr-defined]
        pax, tarfile.XHDTYPE, "utf-8"
    )
    member = tarfile.TarInfo(name)
    member.size = 4
    body = member.tobuf(tarfile.USTAR_FORMAT) + b"data".ljust(tarfile.BLOCKSIZE, b"\0")
    return zlib.compress(header + body + bytes(2 * tarfile.BLOCKSIZE), 9, wbits=31)


def extract(data: bytes, tmp_path: Path) -> kerneltree.KernelTree:
    return container.extract_container_tree(io.BytesIO(data), tmp_path / "tree", KERNEL)


@pytest.mark.parametrize(
    ("pax", "message"),
    [
        ({"size": "nan"}, "a pax size that is not a size"),
        ({"size": "1" * 5000}, "a pax size that is not a size"),
        ({"size": "4\u0664"}, "a pax size that is not a size"),
        ({"mtime": "nan"}, "a pax mtime that is not a time"),
        ({"mtime": "1e400"}, "a pax mtime that is not a time"),
        ({"mtime": "99999999999999999999"}, "a pax mtime that is not a time"),
        ({"mtime": "soon"}, "a pax mtime that is not a time"),
        ({"path": f"{BUILD}/a\0b"}, "a member name with a NUL byte"),
        ({"path": f"{BUILD}/" + "d/" * 1200 + "f"}, "more than 128 components"),
        ({"linkpath": "x\0y"}, "with a NUL byte or more than 4095 bytes in its target"),
    ],
    ids=["nan-size", "long-size", "indic-size", "nan-mtime", "inf-mtime", "huge-mtime",
         "word-mtime", "nul-path", "deep-path", "nul-link"],
)  # fmt: skip
def test_bad_pax_headers_are_one_line(tmp_path: Path, pax: dict[str, str], message: str) -> None:
    name = f"{BUILD}/link" if "linkpath" in pax else f"{BUILD}/Makefile"
    data = pax_archive(pax, name)
    if "linkpath" in pax:  # make the member a symbolic link
        raw = bytearray(zlib.decompress(data, wbits=31))
        header_end = raw.index(name.encode()) // tarfile.BLOCKSIZE * tarfile.BLOCKSIZE
        info = tarfile.TarInfo(name)
        info.type = tarfile.SYMTYPE
        raw[header_end : header_end + 2 * tarfile.BLOCKSIZE] = info.tobuf(
            tarfile.USTAR_FORMAT
        ) + bytes(tarfile.BLOCKSIZE)
        data = zlib.compress(bytes(raw), 9, wbits=31)
    with pytest.raises(DriverError, match=message) as error:
        extract(data, tmp_path)
    assert "\n" not in str(error.value)


def test_a_binary_mtime_beyond_any_clock_is_one_line(tmp_path: Path) -> None:
    member = tarfile.TarInfo(f"{BUILD}/Makefile")
    member.mtime = 1 << 80  # GNU tar's base-256 field holds it; os.utime overflows
    raw = member.tobuf(tarfile.GNU_FORMAT) + bytes(2 * tarfile.BLOCKSIZE)
    with pytest.raises(DriverError, match="an implausible modification time"):
        extract(zlib.compress(raw, 9, wbits=31), tmp_path)


def test_a_path_of_1200_components_is_one_line(tmp_path: Path) -> None:
    member = tarfile.TarInfo(f"{BUILD}/" + "d/" * 1200 + "f")
    raw = member.tobuf(tarfile.GNU_FORMAT) + bytes(2 * tarfile.BLOCKSIZE)  # a GNU long name
    with pytest.raises(DriverError, match="more than 128 components"):
        extract(zlib.compress(raw, 9, wbits=31), tmp_path)


# ASCII digits, everywhere a number is read.


def indic(text: str) -> str:
    return text.translate(ARABIC_INDIC)


@pytest.mark.parametrize(
    "env",
    [
        {"DRIVER_BRANCH": SUPERSCRIPT_TWO},  # no version to compare it with
        {"DRIVER_VERSION": "580.105.08", "MAX_THREADS": SUPERSCRIPT_TWO},
        {"DRIVER_VERSION": indic("580.105.08")},
    ],
    ids=["branch", "threads", "version"],
)
def test_the_configuration_takes_ascii_digits_only(env: dict[str, str]) -> None:
    with pytest.raises(DriverError, match="invalid"):
        DriverConfig.from_env({"TARGETARCH": "amd64", **env}, require_version=False)


def test_a_pid_file_with_other_digits_is_no_pid(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    write(paths(PERSISTENCED.pid_file), SUPERSCRIPT_TWO)
    assert read_pid(paths, PERSISTENCED) is None
    write(paths(PERSISTENCED.pid_file), indic("4242"))
    assert read_pid(paths, PERSISTENCED) is None


def test_a_refcount_with_other_digits_is_not_a_count(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    write(paths.sys_module / "nvidia/refcnt", SUPERSCRIPT_TWO + "\n")
    write(paths.sys_module / "nvidia_uvm/refcnt", "2\n")
    assert module_refcounts(paths) == {"nvidia_uvm": 2}


@pytest.mark.parametrize("skip", [SUPERSCRIPT_TWO, indic("735")])
def test_a_run_header_takes_ascii_digits_only(tmp_path: Path, skip: str) -> None:
    runfile = tmp_path / "NVIDIA-Linux-x86_64-580.105.08.run"
    runfile.write_text(
        f'#!/bin/sh\nCRCsum="1"\nMD5="00000000000000000000000000000000"\nskip={skip}\n'
    )
    with pytest.raises(DriverError, match="no valid skip= line"):
        read_header(runfile)


MANIFEST_HEAD = "NVIDIA driver\n580.105.08\nx\nnvidia\nx\nx\nx\nx\n"


@pytest.mark.parametrize(
    "line",
    [
        f"nvidia-smi {indic('0755')} UTILITY_BINARY MODULE:nvml",
        f"kernel/a/b.h 0644 KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:{SUPERSCRIPT_TWO} MODULE:x",
    ],
    ids=["mode", "depth"],
)
def test_a_manifest_takes_ascii_digits_only(line: str) -> None:
    with pytest.raises(DriverError, match="is malformed"):
        parse_manifest(MANIFEST_HEAD + line + "\n")


def test_the_kernels_gcc_version_takes_ascii_digits_only(tmp_path: Path) -> None:
    write(tmp_path / ".config", f"CONFIG_GCC_VERSION={SUPERSCRIPT_TWO}\n")
    assert kernel_gcc_major(kernel_config(tmp_path)) is None


def test_version_parsers_take_ascii_digits_only() -> None:
    with pytest.raises(DriverError, match="invalid Flatcar version"):
        FlatcarVersion.parse(indic("4593.2.5"))
    with pytest.raises(DriverError, match="cannot read a kernel version"):
        parse_kernel_release(indic("6.12.81") + "-flatcar")
    banner = f"Linux version 6.12.81-flatcar (b@h) (gcc) #{indic('1')} SMP\n"
    with pytest.raises(DriverError, match="no kernel banner found"):
        kernel_banner(banner.encode(), source="vmlinuz")
