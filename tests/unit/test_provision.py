"""python3 -m nvidia_driver.provision: the image-build steps, against file:// URLs."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from nvidia_driver import provision
from nvidia_driver.errors import DriverError

VERSION = "580.178.04"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_checksum_specs() -> None:
    one, two = "a" * 64, "b" * 64
    assert provision.checksum_for(one.upper(), "arm64") == one
    assert provision.checksum_for(f"amd64={one}, arm64={two}", "arm64") == two
    with pytest.raises(DriverError, match="lists no checksum for arm64"):
        provision.checksum_for(f"amd64={one}", "arm64")
    with pytest.raises(DriverError, match="is not a SHA-256"):
        provision.checksum_for("TODO", "amd64")


def test_nvidia_url_layouts() -> None:
    base = "https://us.download.nvidia.com/tesla/"
    assert provision.driver_url(base, VERSION, "arm64") == (
        f"https://us.download.nvidia.com/tesla/{VERSION}/NVIDIA-Linux-aarch64-{VERSION}.run"
    )
    assert provision.redist_manifest_url("https://h/redist", VERSION) == (
        f"https://h/redist/redistrib_{VERSION}.json"
    )


def _runfile_server(tmp_path: Path, body: bytes) -> str:
    directory = tmp_path / "tesla" / VERSION
    directory.mkdir(parents=True)
    (directory / f"NVIDIA-Linux-x86_64-{VERSION}.run").write_bytes(body)
    return (tmp_path / "tesla").as_uri()


def test_the_driver_is_verified_then_handed_to_the_userspace_installer(tmp_path: Path) -> None:
    body = b"#!/bin/sh\necho a makeself archive\n"
    calls: list[Sequence[str]] = []

    def runner(argv: Sequence[str]) -> None:
        calls.append(argv)
        assert Path(argv[argv.index("--run") + 1]).read_bytes() == body

    provision.install_driver(base_url=_runfile_server(tmp_path, body), version=VERSION,
                             arch="amd64", sha256_spec=f"amd64={_sha256(body)}",
                             root=tmp_path / "root", runner=runner)  # fmt: skip
    [argv] = calls
    assert argv[1:4] == ["-m", "nvidia_driver.userspace", "install"]
    assert argv[argv.index("--sha256") + 1] == _sha256(body)
    assert argv[argv.index("--arch") + 1] == "amd64"
    assert not Path(argv[argv.index("--run") + 1]).exists()  # never left for a layer


def test_a_driver_with_the_wrong_checksum_is_not_installed(tmp_path: Path) -> None:
    def runner(argv: Sequence[str]) -> None:
        raise AssertionError(argv)

    with pytest.raises(DriverError, match="the download is damaged or the recorded checksum"):
        provision.install_driver(base_url=_runfile_server(tmp_path, b"x"), version=VERSION,
                                 arch="amd64", sha256_spec="0" * 64, root=tmp_path,
                                 runner=runner)  # fmt: skip


def test_a_wrong_checksum_stops_the_image_build_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the Dockerfile's RUN prints: the file, the expected and the actual digest."""
    body = b"#!/bin/sh\nnot the file versions.toml names\n"
    expected = "0" * 64
    code = provision.main([
        "driver", "--arch", "amd64", "--base-url", _runfile_server(tmp_path, body),
        "--version", VERSION, "--sha256", f"amd64={expected}", "--root", str(tmp_path / "root"),
    ])  # fmt: skip
    assert code == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"ERROR: NVIDIA-Linux-x86_64-{VERSION}.run: expected SHA-256 {expected}")
    assert f"got {_sha256(body)}" in line
    assert not (tmp_path / "root").exists()


def test_a_missing_driver_is_reported_with_its_url(tmp_path: Path) -> None:
    with pytest.raises(DriverError, match=rf"cannot download .*NVIDIA-Linux-aarch64-{VERSION}"):
        provision.install_driver(base_url=_runfile_server(tmp_path, b"x"), version=VERSION,
                                 arch="arm64", sha256_spec="0" * 64, root=tmp_path)  # fmt: skip


# --- fabric manager ----------------------------------------------------------------------------


def _archive(path: Path, top: str, files: dict[str, bytes], links: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            info.mode = 0o755 if name.startswith(("bin/", "sbin/")) else 0o644
            tar.addfile(info, io.BytesIO(data))
        for name, target in links.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def _redist(tmp_path: Path, *, nvlsm: bool, fm_version: str = VERSION) -> str:
    base = tmp_path / "redist"
    top = f"fabricmanager-linux-x86_64-{VERSION}-archive"
    fm = _archive(
        base / "fabricmanager/linux-x86_64" / f"{top}.tar.xz",
        top,
        {
            "bin/nv-fabricmanager": b"fm",
            "bin/nvswitch-audit": b"audit",
            "sbin/nvidia-fabricmanager-start.sh": b"#!/bin/sh\n",
            "etc/fabricmanager.cfg": b"LOG_LEVEL=4\n",
            "lib/libnvfm.so.1": b"\x7fELF",
            "share/nvidia/nvswitch/dgxh100_hgxh100_topology": b"topo",
            "include/nv_fm_agent.h": b"/* header */",
            "systemd/nvidia-fabricmanager.service": b"[Unit]",
            "LICENSE": b"license",
        },
        {"lib/libnvfm.so": "libnvfm.so.1"},
    )
    manifest: dict[str, object] = {
        "release_label": VERSION,
        "fabricmanager": {
            "version": fm_version,
            "linux-x86_64": {
                "relative_path": f"fabricmanager/linux-x86_64/{top}.tar.xz",
                "sha256": _sha256(fm),
            },
        },
    }
    if nvlsm:
        nvlsm_top = "nvlsm-linux-x86_64-2025.06.5-archive"
        data = _archive(
            base / "nvlsm/linux-x86_64" / f"{nvlsm_top}.tar.xz",
            nvlsm_top,
            {"sbin/nvlsm": b"sm", "etc/nvlsm.conf": b"conf\n"},
            {},
        )
        manifest["nvlsm"] = {
            "version": "2025.06.5",
            "linux-x86_64": {
                "relative_path": f"nvlsm/linux-x86_64/{nvlsm_top}.tar.xz",
                "sha256": _sha256(data),
            },
        }
    (base / f"redistrib_{VERSION}.json").write_text(json.dumps(manifest))
    return base.as_uri()


def test_fabric_manager_lands_where_the_entrypoint_looks(tmp_path: Path) -> None:
    root = tmp_path / "root"
    provision.install_fabricmanager(
        base_url=_redist(tmp_path, nvlsm=True), version=VERSION, arch="amd64", root=root
    )
    assert (root / "usr/bin/nv-fabricmanager").read_bytes() == b"fm"
    assert (root / "usr/bin/nv-fabricmanager").stat().st_mode & 0o111
    assert (root / "usr/bin/nvidia-fabricmanager-start.sh").is_file()
    assert (root / "usr/share/nvidia/nvswitch/fabricmanager.cfg").read_text() == "LOG_LEVEL=4\n"
    assert (root / "usr/share/nvidia/nvswitch/dgxh100_hgxh100_topology").is_file()
    lib = root / "usr/lib/x86_64-linux-gnu"
    assert (lib / "libnvfm.so").readlink() == Path("libnvfm.so.1")
    assert (root / "usr/bin/nvlsm").is_file()
    assert (root / "usr/share/nvidia/nvlsm/nvlsm.conf").read_text() == "conf\n"
    assert not (root / "usr/include").exists()
    assert not list(root.rglob("*.service"))


def test_a_branch_without_nvlsm_installs_the_fabric_manager_alone(tmp_path: Path) -> None:
    root = tmp_path / "root"
    provision.install_fabricmanager(
        base_url=_redist(tmp_path, nvlsm=False), version=VERSION, arch="amd64", root=root
    )
    assert (root / "usr/bin/nv-fabricmanager").is_file()
    assert not (root / "usr/bin/nvlsm").exists()


def test_a_fabric_manager_of_another_version_is_refused(tmp_path: Path) -> None:
    url = _redist(tmp_path, nvlsm=False, fm_version="580.1.1")
    with pytest.raises(DriverError, match="must match the driver exactly"):
        provision.install_fabricmanager(base_url=url, version=VERSION, arch="amd64", root=tmp_path)


def test_an_architecture_the_manifest_lacks_is_refused(tmp_path: Path) -> None:
    url = _redist(tmp_path, nvlsm=False)
    with pytest.raises(DriverError, match="has no fabricmanager for linux-sbsa"):
        provision.install_fabricmanager(base_url=url, version=VERSION, arch="arm64", root=tmp_path)


def test_a_tampered_archive_is_refused(tmp_path: Path) -> None:
    url = _redist(tmp_path, nvlsm=False)
    [archive] = (tmp_path / "redist").rglob("*.tar.xz")
    archive.write_bytes(archive.read_bytes() + b"\0")
    with pytest.raises(DriverError, match=r"expected SHA-256 .*, got "):
        provision.install_fabricmanager(base_url=url, version=VERSION, arch="amd64", root=tmp_path)


@pytest.mark.parametrize("name", ["../escape", "/abs/file"])
def test_archive_members_cannot_escape(tmp_path: Path, name: str) -> None:
    archive = tmp_path / "a.tar.xz"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        info = tarfile.TarInfo(name)
        tar.addfile(info, io.BytesIO(b""))
    archive.write_bytes(buffer.getvalue())
    with pytest.raises(DriverError, match="not a plain relative path"):
        provision.install_archive(archive, tmp_path / "root", "nvswitch", "x86_64-linux-gnu")


def test_the_command_line_reports_failures_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = provision.main(["fabricmanager", "--arch", "amd64", "--version", VERSION,
                           "--base-url", (tmp_path / "nothing").as_uri()])  # fmt: skip
    assert code == 1
    assert capsys.readouterr().err.startswith("ERROR: cannot download file://")
