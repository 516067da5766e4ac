"""NVIDIA's redistributable archives for one driver release, verified and installed.

``<base>/redistrib_<V>.json`` lists, per component, ``<component>/linux-<x86_64|sbsa>/
<component>-linux-<x86_64|sbsa>-<version>-archive.tar.xz`` with its SHA-256
(docs.nvidia.com/datacenter/tesla/driver-installation-guide, "Tarballs and Zip Archive
Deliverables"). Each archive must match that SHA-256 *and* the one recorded in the repository
(versions.toml ``[drivers."<V>".redist]``, passed as ``component.arch=HEX,...``): a manifest
fetched over TLS alone is not trusted. Only after both verdicts is the archive opened.

Members are mapped by component onto the paths NVIDIA's packages use, and written one by one:
regular files and symlinks whose target is a plain file name only; no member may be written
through a directory that is a symlink, so nothing lands outside the mapped directories.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from nvidia_driver import limits
from nvidia_driver.atomic import replacing
from nvidia_driver.digests import digest_list, valid_sha256
from nvidia_driver.errors import DriverError
from nvidia_driver.formats import tar
from nvidia_driver.log import say
from nvidia_driver.naming import ARCHES, TRIPLETS, redist_platform
from nvidia_driver.safetext import check

NVLSM_HOME = "opt/nvidia/nvlsm"
# Where NVIDIA's NVLink5 start path hands NVLSM its configuration (ubuntu24.04/nvidia-driver).
NVLSM_CONFIG_DIR = "usr/share/nvidia/nvlsm"

Rule = tuple[str, str | None]  # (archive path prefix, destination prefix; None: not installed)
_NOT_NVIDIAS = "the manifest is not NVIDIA's; check FABRICMANAGER_BASE_URL"
_LICENSES = ("LICENSE", "third-party-notices.txt")


@dataclass(frozen=True)
class Component:
    """One archive of redistrib_<V>.json and where its members go.

    ``rules`` map an archive path (without the top directory) by its longest matching prefix;
    ``{lib}`` is the image's library directory. A member no rule maps is left out, named.
    """

    key: str
    title: str
    rules: tuple[Rule, ...]
    required: bool = False
    driver_version: bool = True  # versioned as the driver, which it must match exactly
    arches: tuple[str, ...] = ("amd64", "arm64")
    missing: str = ""  # what a node lacks when the manifest has no such archive


def _docs(directory: str, *names: str) -> tuple[Rule, ...]:
    """License files (LICENSE and third-party-notices.txt unless named) into ``directory``."""
    return tuple((name, f"{directory}/{name}") for name in names or _LICENSES)


def _left_out(*prefixes: str) -> tuple[Rule, ...]:
    return tuple((prefix, None) for prefix in prefixes)


# NVIDIA/yum-packaging-fabric-manager fabricmanager.spec and the AUR nvidia-fabricmanager
# PKGBUILD (580.178.04, 595.91.07, 610.57.04): bin/ to /usr/bin, lib/ to the libdir, etc/ and
# share/nvidia/nvswitch/ to /usr/share/nvidia/nvswitch; headers, units, installer left out.
FABRICMANAGER = Component(
    "fabricmanager", "fabric manager",
    rules=(
        ("bin/", "usr/bin/"), ("lib/", "{lib}/"), ("etc/", "usr/share/nvidia/nvswitch/"),
        ("share/", "usr/share/"), *_docs("usr/share/doc/nvidia-fabricmanager"),
        *_left_out("include/", "systemd/", "sbin/"),
    ),
    required=True,
)  # fmt: skip
# AUR libnvidia-nscq PKGBUILD (580.178.04, 595.91.07, 610.57.04): lib/ and LICENSE; the Yocto
# recipe meta-dstack-nvidia libnvidia-nscq_570.172.08.bb also installs bin/nscq-cli.
NSCQ = Component(
    "libnvidia_nscq", "NSCQ (NVSwitch telemetry for DCGM)",
    rules=(
        ("lib/", "{lib}/"), ("bin/", "usr/bin/"), *_docs("usr/share/doc/libnvidia-nscq"),
    ),
    required=True,
)  # fmt: skip
# The fabric manager's start script runs /opt/nvidia/nvlsm/sbin/nvlsm or aborts; the archive
# holds lib/, sbin/, share/nvidia/nvlsm/, LICENSE, third-party-notices.txt (AUR nvlsm
# PKGBUILD; NVIDIA's GPU rootfs, kata-containers tools/osbuilder/rootfs-builder/nvidia).
NVLSM = Component(
    "nvlsm", "NVLink subnet manager (NVLSM)",
    rules=(
        ("lib/", f"{NVLSM_HOME}/lib/"), ("sbin/", f"{NVLSM_HOME}/sbin/"),
        ("share/", f"{NVLSM_HOME}/share/"), *_docs(NVLSM_HOME),
    ),
    driver_version=False,  # NVLSM has its own versions (2025.06.11, ...)
    missing="NVLink5 nodes (B200, GB200) cannot start the fabric manager with this image",
)  # fmt: skip
# canonical/apt-packaging-imex debian/rules.defs (redist/imex/linux-<arch>/) and
# debian/nvidia-imex-595.install: usr/bin/*, etc/nvidia-imex/config.cfg, LICENSE, docs.
IMEX = Component(
    "imex", "IMEX (multi-node NVLink memory export)",
    rules=(
        ("usr/bin/", "usr/bin/"), ("etc/nvidia-imex/", "etc/nvidia-imex/"),
        ("usr/share/doc/", "usr/share/doc/nvidia-imex/"),
        *_docs("usr/share/doc/nvidia-imex", "LICENSE"),
        *_left_out("lib/systemd/", "usr/lib/systemd/"),
    ),
    missing="GB200/GB300 multi-node NVLink domains need nvidia-imex from the driver root",
)  # fmt: skip
# AUR libnvsdm PKGBUILD (580.105.08, 595.58.03): lib/ to the libdir; amd64 only, as NVIDIA's
# ubuntu24.04/install.sh nvsdm_install says ("libnvsdm packages are not available for arm64").
NVSDM = Component(
    "libnvsdm", "NVSDM (NVLink switch device management)",
    rules=(
        ("lib/", "{lib}/"), ("usr/share/doc/", "usr/share/doc/libnvsdm/"),
        *_docs("usr/share/doc/libnvsdm", "LICENSE"), *_left_out("include/", "apps/"),
    ),
    arches=("amd64",),
    missing="NVLink5 switch management through NVSDM is unavailable",
)  # fmt: skip
COMPONENTS = (FABRICMANAGER, NSCQ, NVLSM, IMEX, NVSDM)
# The archives every image needs, the fabric manager (NVSwitch systems) and NSCQ (DCGM's
# NVSwitch telemetry, a toolkit library): a driver without their record is refused before any
# build (gdc.plan), and not proposed (gdc.propose).
REQUIRED_KEYS = tuple(component.key for component in COMPONENTS if component.required)


@dataclass(frozen=True)
class Archive:
    component: Component
    version: str
    relative_path: str
    sha256: str  # as redistrib_<V>.json lists it

    @property
    def file_name(self) -> str:
        return PurePosixPath(self.relative_path).name

    @property
    def top(self) -> str:
        return self.file_name.removesuffix(".tar.xz")


def recorded_digests(spec: str) -> dict[str, str]:
    """``fabricmanager.amd64=HEX,nvlsm.arm64=HEX`` -> {"fabricmanager.amd64": HEX, ...}."""
    digests = digest_list(spec, "--sha256")
    for key in digests:
        component, _, arch = key.partition(".")
        if arch not in ARCHES or not component:
            raise DriverError(
                f"--sha256 entry {key or digests[key]!r} is not <component>.<amd64|arm64>="
                "<sha256>, e.g. fabricmanager.amd64=<64 hex digits>"
            )
    return digests


def _safe_relative(path: str, what: str) -> PurePosixPath:
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or any(part in {"..", "."} for part in pure.parts):
        raise DriverError(f"{what} {path!r} is not a plain relative path")
    return pure


def listed_archives(manifest: Mapping[str, Any], arch: str, version: str) -> list[Archive]:
    """The archives of redistrib_<version>.json to install for arch, in COMPONENTS order."""
    platform = redist_platform(arch)
    archives = []
    for component in COMPONENTS:
        if arch not in component.arches:
            continue
        entry = manifest.get(component.key, {})
        files = entry.get(platform) if isinstance(entry, Mapping) else None
        if not isinstance(files, Mapping):
            if component.required:
                raise DriverError(
                    f"redistrib_{version}.json lists no {component.key} for {platform}: NVIDIA "
                    "publishes it per driver release; check the driver version and "
                    "FABRICMANAGER_BASE_URL"
                )
            say(f"Skipping {component.title}: redistrib_{version}.json lists none for "
                f"{platform} ({component.missing})")  # fmt: skip
            continue
        # Both reach log lines (NVLSM's version is its own, not the driver's checked one).
        listed = f"redistrib_{version}.json's {component.key}"
        listed_version = check(str(entry.get("version", "")), f"{listed} version", _NOT_NVIDIAS)
        relative_path = str(files.get("relative_path", ""))
        check(relative_path, f"{listed} relative_path", _NOT_NVIDIAS)
        if component.driver_version and listed_version != version:
            raise DriverError(
                f"redistrib_{version}.json has {component.key} {listed_version}, not {version}: "
                f"the {component.title} must match the driver exactly"
            )
        _safe_relative(relative_path, f"{component.key} relative_path")
        sha256 = valid_sha256(str(files.get("sha256", "")), f"{component.key} {platform} sha256")
        archives.append(Archive(component, listed_version, relative_path, sha256))
    return archives


def expected_digest(
    archive: Archive, arch: str, recorded: Mapping[str, str], driver: str
) -> str | None:
    """The repository's SHA-256 for archive; None for an optional archive without a record.

    A required archive (fabric manager, NSCQ) without a record stops the build in one line
    saying where to record it; an optional one is left out, with one line saying so. An
    archive nobody recorded is never installed on the manifest's word alone.
    """
    key = f"{archive.component.key}.{arch}"
    digest = recorded.get(key)
    where = (
        f'versions.toml [drivers."{driver}".redist] as {archive.component.key} = '
        f'{{ version = "{archive.version}", {arch} = "<sha256>" }}'
    )
    if digest is None and archive.component.required:
        raise DriverError(
            f"no SHA-256 recorded for {archive.file_name} ({archive.component.title} "
            f"{archive.version}): `invoke record-driver {driver}` writes it from NVIDIA's "
            f"redistrib_{driver}.json into {where}, or pass --redist-sha256 to invoke build; "
            "nothing was installed"
        )
    if digest is None:
        say(f"Skipping {archive.component.title} {archive.version}: no SHA-256 recorded for "
            f"{archive.file_name} ({archive.component.missing}); `invoke record-driver "
            f"{driver}` records it in {where}, then rebuild")  # fmt: skip
        return None
    if digest != archive.sha256:
        raise DriverError(
            f"redistrib_{driver}.json lists SHA-256 {archive.sha256} for {archive.file_name}, "
            f"but the repository records {digest}: the manifest or the record is wrong; "
            "nothing was installed"
        )
    return digest


# --- installing an archive ---------------------------------------------------------------------


def destination(component: Component, member: PurePosixPath, libdir: str) -> PurePosixPath | None:
    """Where a member (without the archive's top directory) goes under the root, or None."""
    text = member.as_posix()
    matching = [
        (prefix, target)
        for prefix, target in component.rules
        if text == prefix or (prefix.endswith("/") and text.startswith(prefix))
    ]
    prefix, target = max(matching, key=lambda rule: len(rule[0]), default=("", None))
    if target is None:
        return None
    mapped = target.replace("{lib}", libdir)
    return PurePosixPath(mapped + text[len(prefix) :] if prefix.endswith("/") else mapped)


def _plain_link_target(member: tarfile.TarInfo) -> str:
    target = member.linkname
    if not target or "/" in target or target in {".", ".."} or "\0" in target:
        raise DriverError(
            f"archive symlink {member.name} -> {target!r} is not a file name in its own "
            "directory: the archive is not NVIDIA's; nothing more was installed"
        )
    return target


def _parents_without_links(root: Path, relative: PurePosixPath) -> Path:
    """Create the parent directories of root/relative, refusing any that is a symlink."""
    current = root
    for part in relative.parent.parts:
        current = current / part
        if current.is_symlink():
            raise DriverError(
                f"{current} is a symlink: refusing to install {relative} through it "
                "(an archive member must not leave its mapped directory)"
            )
        if not current.exists():
            current.mkdir(mode=0o755)
        elif not current.is_dir():
            raise DriverError(f"{current} is not a directory: cannot install {relative}")
    return current


def install_archive(path: Path, archive: Archive, root: Path, arch: str) -> list[PurePosixPath]:
    """Install a verified archive under root; return what was installed (relative paths)."""
    libdir = f"usr/lib/{TRIPLETS[arch]}"
    installed: list[PurePosixPath] = []
    budget = tar.Budget(limits.REDIST_ENTRIES, limits.REDIST_WRITTEN, limits.REDIST_MEMBER)
    root.mkdir(parents=True, exist_ok=True)
    try:
        # Read by tarfile in stream mode, bounded (formats/tar.py), as the .run's payload is.
        with (
            path.open("rb") as xz,
            tar.TarStream.open(xz, limits.REDIST_INFLATED, budget, "xz") as stream,
        ):
            for member in stream.members():
                budget.take(member)
                target = _member_destination(member, archive, libdir)
                if target is not None:
                    _install_member(stream, member, root, target)
                    installed.append(target)
    except tar.OverBoundError as exc:
        raise DriverError(
            f"{archive.file_name} is larger than any NVIDIA redist archive ({exc}): refusing it"
        ) from None
    except (tar.TarError, OSError) as exc:
        raise DriverError(f"reading {archive.file_name} failed: {exc}") from None
    return installed


def _member_destination(
    member: tarfile.TarInfo, archive: Archive, libdir: str
) -> PurePosixPath | None:
    name = _safe_relative(member.name.removeprefix("./").rstrip("/"), "archive member")
    if name.parts[0] != archive.top:
        raise DriverError(
            f"{archive.file_name} member {member.name} is outside its top directory "
            f"{archive.top}/: the archive is not NVIDIA's"
        )
    if len(name.parts) < 2 or member.isdir():  # noqa: PLR2004 - <top>/<file>
        return None
    if not (member.isfile() or member.issym()):
        raise DriverError(
            f"{archive.file_name} member {member.name} is neither a file nor a symlink"
        )
    return destination(archive.component, PurePosixPath(*name.parts[1:]), libdir)


def _install_member(
    stream: tar.TarStream, member: tarfile.TarInfo, root: Path, target: PurePosixPath
) -> None:
    parent = _parents_without_links(root, target)
    final = parent / target.name
    if final.is_dir() and not final.is_symlink():
        raise DriverError(f"{final} is a directory: cannot install {member.name} over it")
    if member.issym():
        link = _plain_link_target(member)
        with replacing(final) as staged:
            staged.symlink_to(link)
        return
    mode = 0o755 if member.mode & 0o111 else 0o644  # no setuid, whatever the archive says
    with replacing(final) as staged, staged.open("xb") as out:
        stream.copy(member, out.fileno())
        staged.chmod(mode)


NVLSM_LD_CONF = "etc/ld.so.conf.d/nvidia-nvlsm.conf"


def link_nvlsm_config(root: Path) -> None:
    """/usr/share/nvidia/nvlsm -> NVLSM's own share/nvidia/nvlsm, where init points NVLSM.

    NVLSM's own libraries (libgrpc_mgr.so) are in /opt/nvidia/nvlsm/lib: the linker cache
    gets that directory too, whether or not the binary carries a run path to it.
    """
    source = root / NVLSM_HOME / "share/nvidia/nvlsm"
    if not source.is_dir():
        raise DriverError(
            f"the NVLSM archive has no share/nvidia/nvlsm/ (looked in {source}): wrong archive?"
        )
    link = PurePosixPath(NVLSM_CONFIG_DIR)
    parent = _parents_without_links(root, link)
    target = os.path.relpath(source, parent)
    final = parent / link.name
    if not final.is_symlink() and final.exists():
        raise DriverError(f"{final} exists and is not NVLSM's link: refusing to replace it")
    with replacing(final) as staged:
        staged.symlink_to(target)
    conf = PurePosixPath(NVLSM_LD_CONF)
    with replacing(_parents_without_links(root, conf) / conf.name) as staged:
        staged.write_text(f"/{NVLSM_HOME}/lib\n")
