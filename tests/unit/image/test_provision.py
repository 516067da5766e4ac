"""python3 -m nvidia_driver.provision: the image-build steps, against file:// URLs."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fetch_server import ReleaseServer
from runfile_builder import build_run
from userspace_package import EXPECTED_FILES, installed, make_package

from nvidia_driver import limits, naming
from nvidia_driver.errors import DriverError
from nvidia_driver.image import provision
from nvidia_driver.sources import redist

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
    assert naming.driver_url(base, VERSION, "arm64") == (
        f"https://us.download.nvidia.com/tesla/{VERSION}/NVIDIA-Linux-aarch64-{VERSION}.run"
    )
    assert naming.redist_manifest_url("https://h/redist", VERSION) == (
        f"https://h/redist/redistrib_{VERSION}.json"
    )


def _runfile_server(tmp_path: Path, body: bytes) -> str:
    directory = tmp_path / "tesla" / VERSION
    directory.mkdir(parents=True)
    (directory / f"NVIDIA-Linux-x86_64-{VERSION}.run").write_bytes(body)
    return (tmp_path / "tesla").as_uri()


def test_the_driver_is_verified_then_its_userspace_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = build_run(tmp_path / "built.run", make_package(tmp_path / "package"), "xz")
    body = built.path.read_bytes()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    root = tmp_path / "root"
    provision.install_driver(base_url=_runfile_server(tmp_path, body), version=VERSION,
                             arch="amd64", sha256_spec=f"amd64={_sha256(body)}",
                             root=root)  # fmt: skip
    # No man pages: the image has none.
    assert installed(root) == {name: mode for name, mode in EXPECTED_FILES.items()
                               if not name.startswith("usr/share/man/")}  # fmt: skip
    assert not any(scratch.iterdir())  # the .run is never left for a layer


def test_a_driver_with_the_wrong_checksum_is_not_installed(tmp_path: Path) -> None:
    with pytest.raises(DriverError, match="the download is damaged or the recorded checksum"):
        provision.install_driver(base_url=_runfile_server(tmp_path, b"x"), version=VERSION,
                                 arch="amd64", sha256_spec="0" * 64,
                                 root=tmp_path / "root")  # fmt: skip
    assert not (tmp_path / "root").exists()


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


# --- bounded downloads (download.py's rules, as for the entrypoint) ---------------------------


RUN_PATH = f"{VERSION}/NVIDIA-Linux-x86_64-{VERSION}.run"


@pytest.fixture
def tesla(tmp_path: Path) -> Iterator[ReleaseServer]:
    (tmp_path / "tesla" / VERSION).mkdir(parents=True)
    (tmp_path / "tesla" / RUN_PATH).write_bytes(b"#!/bin/sh\n" * 64)
    with ReleaseServer(tmp_path / "tesla") as server:
        yield server


def test_a_redirect_off_nvidia_s_hosts_is_refused(tesla: ReleaseServer, tmp_path: Path) -> None:
    tesla.redirects[f"/{RUN_PATH}"] = "http://mirror.example.org/file.run"
    refused = (r"refusing the redirect of .* to http://mirror\.example\.org/file\.run: "
               r"mirror\.example\.org is not among the allowed hosts "
               r"\(127\.0\.0\.1, download\.nvidia\.com, \*\.download\.nvidia\.com\)")  # fmt: skip
    with pytest.raises(DriverError, match=refused):
        provision.download(tesla.url(RUN_PATH), tmp_path / "file.run")
    assert not (tmp_path / "file.run").exists()


def test_a_trickling_server_is_dropped_at_the_deadline(
    tesla: ReleaseServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image build must not hang on a server that sends a byte now and then."""
    monkeypatch.setenv("NVIDIA_DRIVER_DOWNLOAD_DEADLINE", "0.5")
    tesla.trickled[f"/{RUN_PATH}"] = (1, 0.1)
    started = time.monotonic()
    with pytest.raises(DriverError, match=r"did not finish within 0\.5 s"):
        provision.download(tesla.url(RUN_PATH), tmp_path / "file.run")
    assert time.monotonic() - started < 3


def test_a_missing_archive_names_the_driver_not_flatcar(
    tesla: ReleaseServer, tmp_path: Path
) -> None:
    with pytest.raises(DriverError) as raised:
        provision.download(tesla.url("redistrib_1.2.3.json"), tmp_path / "x")
    assert str(raised.value).endswith(
        "does not exist (HTTP 404): no such NVIDIA driver release or archive; check the driver "
        "version and base URL"
    )


# --- redist archives ---------------------------------------------------------------------------

NVLSM_VERSION = "2025.06.11"
FM_TOP = f"fabricmanager-linux-x86_64-{VERSION}-archive"


def _archive(path: Path, top: str, files: dict[str, bytes], links: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            info.mode = 0o755 if name.split("/")[-2:][0] in {"bin", "sbin"} else 0o644
            tar.addfile(info, io.BytesIO(data))
        for name, target in links.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


# The real layouts: fabricmanager.spec (NVIDIA/yum-packaging-fabric-manager) and the AUR
# PKGBUILDs of nvidia-fabricmanager, libnvidia-nscq and nvlsm; canonical/apt-packaging-imex.
FM_FILES = {
    "bin/nv-fabricmanager": b"fm",
    "bin/nvswitch-audit": b"audit",
    "bin/nvidia-fabricmanager-start.sh": b"#!/bin/sh\n",
    "etc/fabricmanager.cfg": b"LOG_LEVEL=4\n",
    "lib/libnvfm.so.1": b"\x7fELF",
    "share/nvidia/nvswitch/dgxh100_hgxh100_topology": b"topo",
    "include/nv_fm_agent.h": b"/* header */",
    "systemd/nvidia-fabricmanager.service": b"[Unit]",
    "sbin/fm_run_package_installer.sh": b"#!/bin/sh\n",
    "LICENSE": b"license",
    "third-party-notices.txt": b"notices",
}
COMPONENT_FILES: dict[str, tuple[str, dict[str, bytes], dict[str, str]]] = {
    "libnvidia_nscq": (VERSION, {f"lib/libnvidia-nscq.so.{VERSION}": b"\x7fELF",
                                 "LICENSE": b"license"}, {}),
    "nvlsm": (NVLSM_VERSION, {"sbin/nvlsm": b"sm", "lib/libgrpc_mgr.so": b"\x7fELF",
                              "share/nvidia/nvlsm/nvlsm.conf": b"conf\n", "LICENSE": b"l",
                              "third-party-notices.txt": b"n"}, {}),
    "imex": (VERSION, {"usr/bin/nvidia-imex": b"imex", "usr/bin/nvidia-imex-ctl": b"ctl",
                       "etc/nvidia-imex/config.cfg": b"SERVER_PORT=50000\n",
                       "lib/systemd/system/nvidia-imex.service": b"[Unit]",
                       "LICENSE": b"l"}, {}),
    "libnvsdm": (VERSION, {f"lib/libnvsdm.so.{VERSION}": b"\x7fELF", "LICENSE": b"l",
                           "include/nvsdm.h": b"/* */"}, {}),
}  # fmt: skip


@dataclass
class Redist:
    url: str
    base: Path
    recorded: dict[str, str]

    @property
    def spec(self) -> str:
        return ",".join(f"{key}={value}" for key, value in self.recorded.items())


def _redist(
    tmp_path: Path,
    *,
    components: tuple[str, ...] = ("libnvidia_nscq", "nvlsm", "imex", "libnvsdm"),
    fm_version: str = VERSION,
    fm_links: dict[str, str] | None = None,
) -> Redist:
    base = tmp_path / "redist"
    fm = _archive(base / f"fabricmanager/linux-x86_64/{FM_TOP}.tar.xz", FM_TOP, FM_FILES,
                  {"lib/libnvfm.so": "libnvfm.so.1"} if fm_links is None else fm_links)  # fmt: skip
    manifest: dict[str, object] = {
        "release_label": VERSION,
        "release_product": "nvidia-driver",
        "fabricmanager": {
            "version": fm_version,
            "linux-x86_64": {
                "relative_path": f"fabricmanager/linux-x86_64/{FM_TOP}.tar.xz",
                "sha256": _sha256(fm),
            },
        },
    }
    recorded = {"fabricmanager.amd64": _sha256(fm)}
    for key in components:
        version, files, links = COMPONENT_FILES[key]
        top = f"{key}-linux-x86_64-{version}-archive"
        relative = f"{key}/linux-x86_64/{top}.tar.xz"
        data = _archive(base / relative, top, files, links)
        manifest[key] = {
            "version": version,
            "linux-x86_64": {"relative_path": relative, "sha256": _sha256(data)},
        }
        recorded[f"{key}.amd64"] = _sha256(data)
    (base / f"redistrib_{VERSION}.json").write_text(json.dumps(manifest))
    return Redist(base.as_uri(), base, recorded)


def _install(redist: Redist, root: Path, spec: str | None = None) -> list[str]:
    archives = provision.install_redist(
        base_url=redist.url, version=VERSION, arch="amd64",
        sha256_spec=redist.spec if spec is None else spec, root=root,
    )  # fmt: skip
    return [archive.component.key for archive in archives]


@pytest.fixture(autouse=True)
def ldconfig_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """ldconfig -r needs root: an ldconfig first on PATH records its arguments instead."""
    log, stubs = tmp_path / "ldconfig.log", tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "ldconfig").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (stubs / "ldconfig").chmod(0o755)
    monkeypatch.setenv("PATH", f"{stubs}:{os.environ.get('PATH', os.defpath)}")
    return log


def test_every_archive_lands_where_nvidia_s_packages_put_it(
    tmp_path: Path, ldconfig_calls: Path
) -> None:
    root = tmp_path / "root"
    installed = _install(_redist(tmp_path), root)
    assert installed == ["fabricmanager", "libnvidia_nscq", "nvlsm", "imex", "libnvsdm"]
    assert (root / "usr/bin/nv-fabricmanager").read_bytes() == b"fm"
    assert (root / "usr/bin/nv-fabricmanager").stat().st_mode & 0o111
    assert (root / "usr/bin/nvidia-fabricmanager-start.sh").is_file()
    assert (root / "usr/share/nvidia/nvswitch/fabricmanager.cfg").read_text() == "LOG_LEVEL=4\n"
    assert (root / "usr/share/nvidia/nvswitch/dgxh100_hgxh100_topology").is_file()
    lib = root / "usr/lib/x86_64-linux-gnu"
    assert (lib / "libnvfm.so").readlink() == Path("libnvfm.so.1")
    assert (lib / f"libnvidia-nscq.so.{VERSION}").is_file()
    assert (lib / f"libnvsdm.so.{VERSION}").is_file()
    # NVLSM as the fabric manager's start script looks for it, its config where init points.
    assert (root / "opt/nvidia/nvlsm/sbin/nvlsm").read_bytes() == b"sm"
    assert (root / "opt/nvidia/nvlsm/lib/libgrpc_mgr.so").is_file()
    assert (root / "usr/share/nvidia/nvlsm/nvlsm.conf").read_text() == "conf\n"
    assert (root / "usr/share/nvidia/nvlsm").is_symlink()
    assert (root / "etc/ld.so.conf.d/nvidia-nvlsm.conf").read_text() == "/opt/nvidia/nvlsm/lib\n"
    assert not (root / "usr/bin/nvlsm").exists()
    assert (root / "usr/bin/nvidia-imex").is_file()
    assert (root / "usr/bin/nvidia-imex-ctl").is_file()
    assert (root / "etc/nvidia-imex/config.cfg").is_file()
    assert (root / "usr/share/doc/nvidia-fabricmanager/third-party-notices.txt").is_file()
    assert not (root / "usr/include").exists()
    assert not list(root.rglob("*.service"))
    assert not list(root.rglob("fm_run_package_installer.sh"))
    # SONAME links, as for the .run
    assert ldconfig_calls.read_text().splitlines() == [f"-r {root}"]


def test_a_manifest_without_the_optional_archives_says_what_the_node_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    assert _install(_redist(tmp_path, components=("libnvidia_nscq",)), root) == [
        "fabricmanager", "libnvidia_nscq"
    ]  # fmt: skip
    out = capsys.readouterr().out
    assert "Skipping NVLink subnet manager (NVLSM): redistrib_580.178.04.json lists none" in out
    assert "NVLink5 nodes (B200, GB200) cannot start the fabric manager" in out
    assert "Skipping IMEX (multi-node NVLink memory export)" in out
    assert not (root / "opt/nvidia/nvlsm").exists()


def test_a_manifest_without_nscq_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DriverError, match="lists no libnvidia_nscq for linux-x86_64"):
        _install(_redist(tmp_path, components=()), tmp_path / "root")


@pytest.mark.parametrize(
    ("key", "field", "value"),
    [("nvlsm", "version", "2025.06.11\nERROR: forged"), ("nvlsm", "version", "2025\x1b[2J"),
     ("fabricmanager", "version", f"{VERSION}\u2028x"),
     ("nvlsm", "relative_path", "nvlsm/linux-x86_64/a\rb.tar.xz")],
)  # fmt: skip
def test_a_manifest_value_with_a_line_break_or_control_character_is_refused_unlogged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, field: str, value: str
) -> None:
    redist = _redist(tmp_path)
    path = redist.base / f"redistrib_{VERSION}.json"
    manifest = json.loads(path.read_text())
    entry = manifest[key] if field == "version" else manifest[key]["linux-x86_64"]
    entry[field] = value
    path.write_text(json.dumps(manifest))
    with pytest.raises(DriverError) as raised:
        _install(redist, tmp_path / "root")
    assert str(raised.value) == (
        f"redistrib_{VERSION}.json's {key} {field} {value!r}, which holds U+"
        f"{ord(next(c for c in value if not c.isprintable())):04X}, "
        f"{'a line break' if len(value.splitlines()) > 1 else 'a control character'} that would "
        "let it start a line of its own where it is written: the manifest is not NVIDIA's; "
        "check FABRICMANAGER_BASE_URL"
    )
    assert value not in capsys.readouterr().out
    assert not (tmp_path / "root").exists()


def test_a_fabric_manager_of_another_version_is_refused(tmp_path: Path) -> None:
    redist = _redist(tmp_path, fm_version="580.1.1")
    with pytest.raises(DriverError, match="must match the driver exactly"):
        _install(redist, tmp_path / "root")


def test_an_architecture_the_manifest_lacks_is_refused(tmp_path: Path) -> None:
    redist = _redist(tmp_path)
    with pytest.raises(DriverError, match="lists no fabricmanager for linux-sbsa"):
        provision.install_redist(base_url=redist.url, version=VERSION, arch="arm64",
                                 sha256_spec="", root=tmp_path)  # fmt: skip


def test_a_tampered_archive_is_refused(tmp_path: Path) -> None:
    redist = _redist(tmp_path)
    archive = redist.base / f"fabricmanager/linux-x86_64/{FM_TOP}.tar.xz"
    archive.write_bytes(archive.read_bytes() + b"\0")
    with pytest.raises(DriverError, match=r"expected SHA-256 .*, got "):
        _install(redist, tmp_path / "root")
    assert not (tmp_path / "root").exists()


def test_an_archive_is_checked_against_the_repository_not_only_the_manifest(
    tmp_path: Path,
) -> None:
    """A manifest and archive swapped together (say, on a mirror) still fail the record."""
    redist = _redist(tmp_path)
    recorded = dict(redist.recorded, **{"nvlsm.amd64": "0" * 64})
    spec = ",".join(f"{key}={value}" for key, value in recorded.items())
    with pytest.raises(DriverError, match=r"lists SHA-256 \w+ for nvlsm-linux-x86_64-2025\.06"
                       r"\.11-archive\.tar\.xz, but the repository records 0{64}"):  # fmt: skip
        _install(redist, tmp_path / "root", spec)
    assert not (tmp_path / "root").exists(), "nothing is installed before every verdict"


def test_an_optional_archive_without_a_recorded_digest_is_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """versions.toml records no IMEX digest yet: the image is built without it, never unchecked."""
    redist = _redist(tmp_path)
    spec = ",".join(f"{k}={v}" for k, v in redist.recorded.items() if not k.startswith("imex"))
    root = tmp_path / "root"
    assert _install(redist, root, spec) == ["fabricmanager", "libnvidia_nscq", "nvlsm", "libnvsdm"]
    assert not (root / "usr/bin/nvidia-imex").exists()
    out = capsys.readouterr().out
    assert (
        f"Skipping IMEX (multi-node NVLink memory export) {VERSION}: no SHA-256 recorded for "
        f"imex-linux-x86_64-{VERSION}-archive.tar.xz" in out
    )
    assert f'versions.toml [drivers."{VERSION}".redist] as imex = ' in out


def test_a_fabric_manager_without_a_recorded_digest_is_not_installed(tmp_path: Path) -> None:
    redist = _redist(tmp_path)
    spec = ",".join(f"{k}={v}" for k, v in redist.recorded.items() if not k.startswith("fabric"))
    with pytest.raises(DriverError, match=r"no SHA-256 recorded for fabricmanager-linux-x86_64-"
                       r'580\.178\.04-archive\.tar\.xz .*versions\.toml \[drivers\."580\.178'
                       r'\.04"\.redist\] as fabricmanager = '):  # fmt: skip
        _install(redist, tmp_path / "root", spec)
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize(
    "spec", ["fabricmanager=" + "a" * 64, "fabricmanager.riscv=" + "a" * 64, "nvlsm.amd64=TODO"]
)
def test_a_malformed_digest_list_is_refused(spec: str) -> None:
    with pytest.raises(DriverError, match="--sha256"):
        redist.recorded_digests(spec)


# Issue 10 item 8: a link target of "..", or a parent that is a link, wrote outside the
# mapped directories at image build time.
@pytest.mark.parametrize(
    ("links", "files"),
    [
        ({"lib/up": ".."}, {}),
        ({"lib/here": "."}, {}),
        ({"lib/escape": "../../../../etc/passwd"}, {}),
        ({"lib/abs": "/etc/passwd"}, {}),
        ({"lib/dir": "libnvfm.so.1"}, {"lib/dir/evil": b"x"}),
    ],
    ids=["dotdot", "dot", "relative-escape", "absolute", "file-through-link"],
)
def test_archive_links_cannot_lead_out_of_their_directory(
    tmp_path: Path, links: dict[str, str], files: dict[str, bytes]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "image"
    top = "fabricmanager-linux-x86_64-580.178.04-archive"
    path = tmp_path / "a.tar.xz"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for name, target in links.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for name, data in {"lib/libnvfm.so.1": b"lib", **files}.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo(f"{top}/lib/up/outside/planted")  # through the ".." link
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    path.write_bytes(buffer.getvalue())
    archive = redist.Archive(redist.FABRICMANAGER, VERSION, f"x/{top}.tar.xz", "0" * 64)
    with pytest.raises(DriverError, match="symlink"):
        redist.install_archive(path, archive, root, "amd64")
    assert not list(outside.iterdir())
    assert not (tmp_path / "planted").exists()


def _install_one(tmp_path: Path, info: tarfile.TarInfo, data: bytes = b"") -> None:
    """Install a fabric manager archive of that one member into tmp_path/root."""
    path = tmp_path / "a.tar.xz"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buffer.getvalue())
    archive = redist.Archive(redist.FABRICMANAGER, VERSION, f"x/{FM_TOP}.tar.xz", "0" * 64)
    redist.install_archive(path, archive, tmp_path / "root", "amd64")


@pytest.mark.parametrize("name", ["../escape", "/abs/file", "other-top/bin/x"])
def test_archive_members_cannot_escape(tmp_path: Path, name: str) -> None:
    with pytest.raises(DriverError, match=r"not a plain relative path|outside its top directory"):
        _install_one(tmp_path, tarfile.TarInfo(name))


def test_devices_and_hard_links_are_refused(tmp_path: Path) -> None:
    info = tarfile.TarInfo(f"{FM_TOP}/bin/nv-fabricmanager")
    info.type, info.linkname = tarfile.LNKTYPE, "/etc/shadow"
    with pytest.raises(DriverError, match="neither a file nor a symlink"):
        _install_one(tmp_path, info)


def test_setuid_bits_in_an_archive_are_dropped(tmp_path: Path) -> None:
    info = tarfile.TarInfo(f"{FM_TOP}/bin/nv-fabricmanager")
    info.size, info.mode = 2, 0o4755
    _install_one(tmp_path, info, b"fm")
    mode = (tmp_path / "root/usr/bin/nv-fabricmanager").stat().st_mode
    assert mode & 0o7777 == 0o755


def test_an_archive_past_its_bounds_is_refused_before_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The redist archives are read as the .run's payload is (formats/tar.py), bounded."""
    monkeypatch.setattr(limits, "REDIST_MEMBER", 1)
    info = tarfile.TarInfo(f"{FM_TOP}/bin/nv-fabricmanager")
    info.size = 2
    larger = f"{FM_TOP}.tar.xz is larger than any NVIDIA redist archive ({FM_TOP}/bin/"
    with pytest.raises(DriverError, match=re.escape(larger)):
        _install_one(tmp_path, info, b"fm")
    assert not (tmp_path / "root/usr/bin/nv-fabricmanager").exists()


def test_an_archive_that_is_not_xz_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a.tar.xz").write_bytes(b"not xz")
    archive = redist.Archive(redist.FABRICMANAGER, VERSION, f"x/{FM_TOP}.tar.xz", "0" * 64)
    with pytest.raises(DriverError, match=re.escape(f"reading {FM_TOP}.tar.xz failed: ")):
        redist.install_archive(tmp_path / "a.tar.xz", archive, tmp_path / "root", "amd64")


def test_the_command_line_reports_failures_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = provision.main(["redist", "--arch", "amd64", "--version", VERSION, "--sha256", "",
                           "--base-url", (tmp_path / "nothing").as_uri()])  # fmt: skip
    assert code == 1
    assert capsys.readouterr().err.startswith("ERROR: cannot download file://")
