"""What formats/tar.py writes of a tar stream, against what GNU tar writes and extracts."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from nvidia_driver import limits
from nvidia_driver.formats import output, tar


def _extract(archive: bytes, root: Path) -> None:
    writer = output.TreeWriter(root, "not a genuine archive")
    budget = tar.Budget(limits.RUN_ENTRIES, limits.RUN_WRITTEN, limits.RUN_MEMBER)
    with tar.TarStream.open(io.BytesIO(archive), limits.RUN_INFLATED, budget, None) as stream:
        for member in stream.members():
            rel = tar.member_path(member.name)
            source = tar.member_path(member.linkname) if member.islnk() else None
            assert stream.write(writer, rel, member, None, source)


def test_a_file_archived_twice_is_extracted_once(tmp_path: Path) -> None:
    # GNU tar stores a file named twice (tar cf a.tar f f) the second time as a hard link to
    # itself, "f link to f", and extracts it as the one file (src/extract.c, extract_link).
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as archive:
        info = tarfile.TarInfo("lib/f")
        info.size = 3
        archive.addfile(info, io.BytesIO(b"hi\n"))
        again = tarfile.TarInfo("lib/f")
        again.type, again.linkname = tarfile.LNKTYPE, "lib/f"
        archive.addfile(again)
    _extract(raw.getvalue(), tmp_path)
    assert (tmp_path / "lib/f").read_bytes() == b"hi\n"
