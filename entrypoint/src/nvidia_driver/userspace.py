"""Install the NVIDIA driver's userspace from its .run, driven by the package's own .manifest.

This replaces ``nvidia-installer`` at image build time (both images, and the tests, take this
path). It installs what a headless compute node needs (shared/reference/nvidia-run-format.md
section 4): NVML, CUDA, OpenCL, Vulkan/EGL libraries with their SONAME links, nvidia-smi and
the other tools, the GSP firmware (under /opt/lib/firmware/nvidia/<version>, which ``init`` copies
into the Operator's /lib/firmware mount), and the kernel module sources that the build and the
GDS/GDRCopy sidecars look for in /usr/src/nvidia-<version>.

Files are picked by basename (the manifest's TYPE does not separate compute from graphics) and
the TYPE decides where they go. The install is all or nothing: every file is first written
under a temporary name beside its destination, then all are renamed into place; a failure
before or during that, or in ldconfig afterwards, removes what was written and puts back what
was replaced.

Usage at image build::

    python3 -m nvidia_driver.userspace install --run FILE [--sha256 HEX] [--root DIR]
        [--arch amd64|arm64] [--no-man-pages]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import secrets
import shutil
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from itertools import takewhile
from pathlib import Path, PurePosixPath

from nvidia_driver import runfile as run
from nvidia_driver.commands import Commands
from nvidia_driver.driverroot import exclusion, library_name, unclaimed_error
from nvidia_driver.errors import DriverError
from nvidia_driver.log import error, say, warn
from nvidia_driver.paths import IMAGE_FIRMWARE_DIR

# --- the .manifest ---------------------------------------------------------------------------

MANIFEST = ".manifest"
MANIFEST_HEADER_LINES = 8
ARCHES = ("NATIVE", "COMPAT32")
TLS_CLASSES = ("CLASSIC", "NEW")  # a field of TLS_LIB/TLS_SYMLINK up to 410.73
INHERIT_PREFIX = "INHERIT_PATH_DEPTH:"
MODULE_PREFIX = "MODULE:"
MAX_MODE = 0o7777
SETUID_PROGRAM = "nvidia-modprobe"  # setuid root, so that users can create the device nodes
_PRIVILEGE_BITS = 0o6000  # setuid and setgid
SYSTEMD_UNIT_DIR = "/usr/lib/systemd/system"


@dataclass(frozen=True)
class FieldCaps:
    """Which optional fields follow a TYPE in a manifest entry, in this order."""

    arch: bool = False
    tls_class: bool = False
    path: bool = False
    inherit: bool = False
    symlink: bool = False


_A = FieldCaps(arch=True)
_AS = FieldCaps(arch=True, symlink=True)
_AP = FieldCaps(arch=True, path=True)
_APS = FieldCaps(arch=True, path=True, symlink=True)
_P = FieldCaps(path=True)
_PS = FieldCaps(path=True, symlink=True)
_I = FieldCaps(inherit=True)
_S = FieldCaps(symlink=True)
_NONE = FieldCaps()

# nvidia-installer's per-type capability table (reference section 3.3).
FILE_TYPES: dict[str, FieldCaps] = {
    "KERNEL_MODULE_SRC": _I, "DKMS_CONF": _I, "KERNEL_MODULE": _NONE,
    "CUDA_ICD": _NONE,
    "OPENGL_LIB": _A, "OPENGL_SYMLINK": _AS,
    "GLVND_LIB": _A, "GLVND_SYMLINK": _AS,
    "GLX_CLIENT_LIB": _A, "GLX_CLIENT_SYMLINK": _AS,
    "EGL_CLIENT_LIB": _A, "EGL_CLIENT_SYMLINK": _AS,
    "TLS_LIB": FieldCaps(arch=True, tls_class=True, path=True),
    "TLS_SYMLINK": FieldCaps(arch=True, tls_class=True, path=True, symlink=True),
    "CUDA_LIB": _AP, "CUDA_SYMLINK": _APS,
    "OPENCL_LIB": _AP, "OPENCL_LIB_SYMLINK": _APS,
    "OPENCL_WRAPPER_LIB": _AP, "OPENCL_WRAPPER_SYMLINK": _APS,
    "UTILITY_LIB": _A, "UTILITY_LIB_SYMLINK": _AS,
    "VDPAU_LIB": _AP, "VDPAU_SYMLINK": _APS,
    "NVCUVID_LIB": _A, "NVCUVID_LIB_SYMLINK": _AS,
    "ENCODEAPI_LIB": _A, "ENCODEAPI_LIB_SYMLINK": _AS,
    "GBM_BACKEND_LIB": _A, "GBM_BACKEND_LIB_SYMLINK": _AS,
    "WINE_LIB": _A,
    "VGX_LIB": _NONE, "VGX_LIB_SYMLINK": _S,
    "GRID_LIB": _P, "GRID_LIB_SYMLINK": _PS,
    "FLEXERA_LIB": _P, "FLEXERA_LIB_SYMLINK": _PS,
    "INSTALLER_BINARY": _NONE, "UTILITY_BINARY": _NONE, "UTILITY_BIN_SYMLINK": _S,
    "NVIDIA_MODPROBE": _P, "MANPAGE": _P, "NVIDIA_MODPROBE_MANPAGE": _P,
    "DOCUMENTATION": _P, "APPLICATION_PROFILE": _P, "DOT_DESKTOP": _P, "ICON": _P,
    "XMODULE_SHARED_LIB": _P, "GLX_MODULE_SHARED_LIB": _P, "GLX_MODULE_SYMLINK": _PS,
    "XORG_OUTPUTCLASS_CONFIG": _NONE, "EXPLICIT_PATH": _P, "OPENGL_DATA": _P,
    "MODULE_SIGNING_KEY": _NONE, "VULKAN_ICD_JSON": _P, "VULKANSC_ICD_JSON": _P,
    "GLVND_EGL_ICD_JSON": _NONE, "EGL_EXTERNAL_PLATFORM_JSON": _NONE,
    "INTERNAL_UTILITY_BINARY": _A, "INTERNAL_UTILITY_LIB": _A, "INTERNAL_UTILITY_DATA": _NONE,
    "FIRMWARE": _I,
    "SYSTEMD_UNIT": _NONE, "SYSTEMD_UNIT_SYMLINK": _PS, "SYSTEMD_SLEEP_SCRIPT": _NONE,
    "SANDBOXUTILS_FILELIST_JSON": _P,
    # Removed from nvidia-installer, known so that old manifests read without warnings.
    "OPENGL_HEADER": _P, "LIBGL_LA": _A, "XMODULE_SYMLINK": _PS, "XMODULE_NEWSYM": _PS,
    "NVIFR_LIB": _A, "NVIFR_LIB_SYMLINK": _AS,
}  # fmt: skip


@dataclass(frozen=True)
class ManifestEntry:
    """One file line: ``file mode TYPE [arch] [path | INHERIT_PATH_DEPTH:N] [target] MODULE:m``."""

    line: int
    file: str  # as written, relative to the package root; for symlinks only the link's name
    mode: int
    file_type: str
    arch: str | None = None
    path: str | None = None
    inherited_dir: str | None = None  # the file's directory minus INHERIT_PATH_DEPTH components
    target: str | None = None
    module: str | None = None

    @property
    def name(self) -> str:
        return PurePosixPath(self.file).name

    @property
    def is_symlink(self) -> bool:
        return FILE_TYPES[self.file_type].symlink


@dataclass(frozen=True)
class UnknownEntry:
    line: int
    file: str
    file_type: str


@dataclass(frozen=True)
class Manifest:
    description: str
    version: str
    kernel_modules: tuple[str, ...]
    entries: tuple[ManifestEntry, ...]
    unknown: tuple[UnknownEntry, ...] = ()


def parse_manifest(text: str) -> Manifest:
    """Parse a .manifest: 8 header lines, entries from line 9 up to the first empty line.

    Entries of unknown types are skipped with a warning (nvidia-installer would reject the
    whole file); a malformed entry of a known type is an error.
    """
    lines = text.split("\n")
    if len(lines) <= MANIFEST_HEADER_LINES or not lines[1].strip():
        raise DriverError(
            "the driver package's .manifest has no version or no entries: the package is "
            "corrupt or not an NVIDIA driver"
        )
    entries: list[ManifestEntry] = []
    unknown: list[UnknownEntry] = []
    for number, line in enumerate(lines[MANIFEST_HEADER_LINES:], MANIFEST_HEADER_LINES + 1):
        tokens = line.split()
        if not tokens:
            break
        if len(tokens) < 3:  # noqa: PLR2004 - file, mode and TYPE are mandatory
            raise _malformed(number, line, "it needs a file, a mode and a type")
        if tokens[2] in FILE_TYPES:
            entries.append(_parse_entry(tokens, number, line))
        else:
            unknown.append(UnknownEntry(number, tokens[0], tokens[2]))
    _warn_unknown(unknown)
    return Manifest(
        description=lines[0].strip(),
        version=lines[1].strip(),
        kernel_modules=tuple(lines[3].split()),
        entries=tuple(entries),
        unknown=tuple(unknown),
    )


def _parse_entry(tokens: list[str], number: int, line: str) -> ManifestEntry:
    file, mode_text, file_type, *rest = tokens
    caps = FILE_TYPES[file_type]
    module = next((t for t in reversed(rest) if t.startswith(MODULE_PREFIX)), None)
    # The optional fields end at the MODULE: tag; a field that is missing before it is absent
    # (e.g. 390's VULKAN_ICD_JSON had no path yet). Words after the fields are ignored, as
    # nvidia-installer ignores them (the GLVND/NON_GLVND flag of 390's GLX_CLIENT_* lines).
    fields = deque(takewhile(lambda token: not token.startswith(MODULE_PREFIX), rest))
    arch = path = inherited_dir = target = None
    if caps.arch:
        arch = fields.popleft() if fields else None
        if arch not in ARCHES:
            raise _malformed(number, line, f"{file_type} needs NATIVE or COMPAT32")
        if caps.tls_class and fields and fields[0] in TLS_CLASSES:
            fields.popleft()
    if caps.path or caps.inherit:
        token = fields.popleft() if fields else None
        if caps.inherit and token is not None and token.startswith(INHERIT_PREFIX):
            inherited_dir = _inherited_dir(file, token, number, line)
        elif caps.path:
            path = token
        else:
            raise _malformed(number, line, f"{file_type} needs {INHERIT_PREFIX}N")
    if caps.symlink:
        target = fields.popleft() if fields else None
    if file_type == "SYSTEMD_UNIT_SYMLINK":
        # Its lines carry no target: nvidia-installer takes the MODULE: tag for one, then
        # replaces it with the unit's own path.
        target = f"{SYSTEMD_UNIT_DIR}/{PurePosixPath(file).name}"
    elif caps.symlink and target is None:
        raise _malformed(number, line, f"{file_type} needs a symlink target")
    return ManifestEntry(
        line=number,
        file=file,
        mode=_mode(mode_text, number, line),
        file_type=file_type,
        arch=arch,
        path=path,
        inherited_dir=inherited_dir,
        target=target,
        module=module.removeprefix(MODULE_PREFIX) if module else None,
    )


def _mode(text: str, number: int, line: str) -> int:
    # ASCII octal digits only: int(text, 8) also takes "0o755", "7_55" and other scripts' digits.
    mode = int(text, 8) if re.fullmatch(r"[0-7]{1,6}", text) else -1
    if not 0 <= mode <= MAX_MODE:
        raise _malformed(number, line, f"{text!r} is not an octal file mode")
    return mode


def _inherited_dir(file: str, token: str, number: int, line: str) -> str:
    """``kernel/nvidia-uvm/hwref/x.h`` at depth 1 is in ``nvidia-uvm/hwref``."""
    depth_text = token.removeprefix(INHERIT_PREFIX)
    directories = PurePosixPath(file).parent.parts
    if not re.fullmatch(r"[0-9]{1,4}", depth_text) or int(depth_text) > len(directories):
        raise _malformed(number, line, f"{token} does not fit the file's path")
    return "/".join(directories[int(depth_text) :])


def _malformed(number: int, line: str, why: str) -> DriverError:
    return DriverError(
        f"the driver package's .manifest line {number} is malformed ({why}): {line.strip()!r}; "
        "the package is corrupt or newer than this installer understands; report it"
    )


def _warn_unknown(unknown: list[UnknownEntry]) -> None:
    by_type: dict[str, list[UnknownEntry]] = {}
    for entry in unknown:
        by_type.setdefault(entry.file_type, []).append(entry)
    for file_type, entries in by_type.items():
        first = entries[0]
        warn(
            f".manifest line {first.line}: unknown file type {file_type}; skipping "
            f"{len(entries)} file(s) of that type, first {first.file}"
        )


def trimmed_manifest(text: str) -> str:
    """Lines 1-8 plus the ``kernel``/``LICENSE`` entries, as NVIDIA's driver container keeps it.

    With the sources beside it, /usr/src/nvidia-<version> is a package nvidia-installer can
    install kernel modules from.
    """
    lines = text.split("\n")
    kept = lines[:MANIFEST_HEADER_LINES] + [
        line for line in lines[MANIFEST_HEADER_LINES:] if line.startswith(("kernel", "LICENSE"))
    ]
    return "\n".join(kept) + "\n"


# --- what a headless compute node gets ---------------------------------------------------------


@dataclass(frozen=True)
class Group:
    title: str
    libraries: frozenset[str] = frozenset()  # names up to ".so": libcuda.so.1 is "libcuda"
    files: frozenset[str] = frozenset()  # exact basenames


# The groups cover the container toolkit's utility, compute, video and graphics lists
# (driver-root.toml, from NVIDIA/libnvidia-container src/nvc_info.c) and what they load.
NVML_LIBRARIES = frozenset({"libnvidia-ml", "libnvidia-cfg"})
NVML_PROGRAMS = frozenset(
    {"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-bug-report.sh"}
)
CUDA_LIBRARIES = frozenset({
    "libcuda", "libcudadebugger", "libnvidia-ptxjitcompiler", "libnvidia-nvvm",
    "libnvidia-nvvm70", "libnvidia-gpucomp", "libnvidia-pkcs11", "libnvidia-pkcs11-openssl3",
    "libnvidia-allocator", "libnvidia-tileiras",
    "libnvidia-fatbinaryloader",  # libcuda's dependency up to 450
})  # fmt: skip
OPENCL_LIBRARIES = frozenset({"libnvidia-opencl", "libnvidia-compiler"})  # compiler: up to 470
VIDEO_LIBRARIES = frozenset(
    {"libnvcuvid", "libnvidia-encode", "libnvidia-opticalflow", "libvdpau_nvidia"}
)
GRAPHICS_LIBRARIES = frozenset({
    "libEGL_nvidia", "libGLX_nvidia", "libGLESv2_nvidia", "libGLESv1_CM_nvidia",
    "libnvidia-eglcore", "libnvidia-glsi", "libnvidia-glcore", "libnvidia-tls",
    "libnvidia-glvkspirv", "libnvidia-rtcore", "libnvoptix", "libnvidia-fbc", "libnvidia-cbl",
    "libnvidia-present",  # Vulkan's presentation layer (580+)
    "libnvidia-vulkan-producer",  # Vulkan swapchains through EGL (up to 5xx)
})  # fmt: skip
GRAPHICS_FILES = frozenset(
    {"nvidia_icd.json", "nvidia_layers.json", "10_nvidia.json", "nvoptix.bin"}
)
GROUPS = (
    Group("NVML and tools", libraries=NVML_LIBRARIES, files=NVML_PROGRAMS),
    Group("CUDA", libraries=CUDA_LIBRARIES),
    Group("CUDA MPS", files=frozenset({"nvidia-cuda-mps-control", "nvidia-cuda-mps-server"})),
    Group("OpenCL", libraries=OPENCL_LIBRARIES, files=frozenset({"nvidia.icd"})),
    Group("Video (NVDEC, NVENC, optical flow, VDPAU)", libraries=VIDEO_LIBRARIES),
    Group("Graphics (EGL, GLX, GLES, Vulkan, OptiX, NvFBC)", libraries=GRAPHICS_LIBRARIES,
          files=GRAPHICS_FILES),
    Group("NGX", libraries=frozenset({"libnvidia-ngx"})),
    Group("Sandbox utilities", libraries=frozenset({"libnvidia-sandboxutils"}),
          files=frozenset({"nvidia-sandboxutils"})),
    Group("nvidia-modprobe", files=frozenset({"nvidia-modprobe"})),
)  # fmt: skip
FIRMWARE_GROUP = "GSP firmware"
MAN_PAGES_GROUP = "man pages"
SOURCES_GROUP = "kernel module sources"
MAN_PAGE_TYPES = frozenset({"MANPAGE", "NVIDIA_MODPROBE_MANPAGE"})
MAN_PAGE_SUFFIX = ".1.gz"
PROGRAMS = frozenset(name for group in GROUPS for name in group.files)  # whose man pages we keep
# Without these the node has no driver to speak of: the manifest must list them.
REQUIRED = ("nvidia-smi", "libnvidia-ml", "libcuda")
KERNEL_SOURCE_DIRS = ("kernel", "kernel-open")

# Types installed into the library directory, under their path field if they have one.
LIBRARY_TYPES = frozenset({
    "OPENGL_LIB", "OPENGL_SYMLINK", "GLVND_LIB", "GLVND_SYMLINK",
    "GLX_CLIENT_LIB", "GLX_CLIENT_SYMLINK", "EGL_CLIENT_LIB", "EGL_CLIENT_SYMLINK",
    "TLS_LIB", "TLS_SYMLINK", "CUDA_LIB", "CUDA_SYMLINK", "OPENCL_LIB", "OPENCL_LIB_SYMLINK",
    "OPENCL_WRAPPER_LIB", "OPENCL_WRAPPER_SYMLINK", "UTILITY_LIB", "UTILITY_LIB_SYMLINK",
    "VDPAU_LIB", "VDPAU_SYMLINK", "NVCUVID_LIB", "NVCUVID_LIB_SYMLINK",
    "ENCODEAPI_LIB", "ENCODEAPI_LIB_SYMLINK", "VGX_LIB", "VGX_LIB_SYMLINK",
    "GRID_LIB", "GRID_LIB_SYMLINK", "FLEXERA_LIB", "FLEXERA_LIB_SYMLINK",
})  # fmt: skip
BINARY_TYPES = frozenset({"UTILITY_BINARY", "UTILITY_BIN_SYMLINK", "INSTALLER_BINARY"})
# Types whose path field is an absolute directory rather than one under a base directory.
ABSOLUTE_PATH_TYPES = frozenset({"NVIDIA_MODPROBE", "EXPLICIT_PATH", "OPENGL_DATA"})

TRIPLETS = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}


@dataclass(frozen=True)
class Layout:
    """Where things go, as absolute paths inside the root being installed into."""

    triplet: str
    version: str

    @property
    def libdir(self) -> PurePosixPath:
        return PurePosixPath("/usr/lib", self.triplet)

    @property
    def firmware_dir(self) -> PurePosixPath:
        # Not /lib/firmware, which the Operator's mount hides: init copies it there from here.
        return PurePosixPath(IMAGE_FIRMWARE_DIR, self.version)

    @property
    def sources_dir(self) -> PurePosixPath:
        return PurePosixPath(f"/usr/src/nvidia-{self.version}")


@dataclass(frozen=True)
class PlannedFile:
    entry: ManifestEntry
    group: str
    destination: PurePosixPath  # absolute, inside the root


def plan(manifest: Manifest, layout: Layout, man_pages: bool = True) -> list[PlannedFile]:
    """The manifest entries a headless compute node gets, each with its destination.

    Every entry is accounted for: installed by a group, or excluded by a rule of
    driver-root.toml. Any other stops the install, naming it: a new NVIDIA release must not
    lose a file unnoticed.
    """
    planned: dict[PurePosixPath, PlannedFile] = {}
    unclaimed = [
        (entry.line, entry.file, entry.file_type)
        for entry in manifest.unknown
        if exclusion(entry.file, entry.file_type) is None
    ]
    for entry in manifest.entries:
        group = _group_of(entry, man_pages)
        if group is None or entry.arch == "COMPAT32":
            if not _accounted(entry):
                unclaimed.append((entry.line, entry.file, entry.file_type))
            continue
        destination = _destination(entry, layout)
        if destination is None:
            unclaimed.append((entry.line, entry.file, entry.file_type))
        elif destination in planned:
            warn(
                f".manifest line {entry.line}: {destination} is already installed from line "
                f"{planned[destination].entry.line}; skipping the duplicate"
            )
        else:
            planned[destination] = PlannedFile(entry, group, destination)
    if unclaimed:
        raise unclaimed_error(manifest.version, sorted(unclaimed))
    _require(manifest, planned.values())
    return list(planned.values())


def _accounted(entry: ManifestEntry) -> bool:
    """An entry no group installs: a man page of a program left out, or an excluded file."""
    if entry.file_type in MAN_PAGE_TYPES:
        return True
    return exclusion(entry.name, entry.file_type, entry.arch) is not None


def _group_of(entry: ManifestEntry, man_pages: bool) -> str | None:
    if entry.file_type == "FIRMWARE":
        return FIRMWARE_GROUP
    if entry.file_type in MAN_PAGE_TYPES:
        page_of = entry.name.removesuffix(MAN_PAGE_SUFFIX)
        wanted = man_pages and entry.name.endswith(MAN_PAGE_SUFFIX) and page_of in PROGRAMS
        return MAN_PAGES_GROUP if wanted else None
    library = library_name(entry.name)
    for group in GROUPS:
        if entry.name in group.files or library in group.libraries:
            return group.title
    return None


def _destination(entry: ManifestEntry, layout: Layout) -> PurePosixPath | None:
    """Where nvidia-installer would put ``entry`` (reference section 3.3), or None."""
    file_type, name = entry.file_type, entry.name
    if file_type in LIBRARY_TYPES:
        base = layout.libdir / _relative(entry.path or "", entry)
    elif file_type in BINARY_TYPES:
        base = PurePosixPath("/usr/bin")
    elif file_type in ABSOLUTE_PATH_TYPES:
        base = PurePosixPath("/") / _relative(entry.path or "/usr/bin", entry)
    elif file_type in MAN_PAGE_TYPES:
        base = PurePosixPath("/usr/share/man") / _relative(entry.path or "man1", entry)
    elif file_type == "CUDA_ICD":
        base = PurePosixPath("/etc/OpenCL/vendors")
    elif file_type == "FIRMWARE":
        base = layout.firmware_dir / _relative(entry.inherited_dir or "", entry)
    elif file_type == "VULKAN_ICD_JSON":
        base = PurePosixPath("/etc/vulkan") / _relative(entry.path or "icd.d", entry)
    elif file_type == "GLVND_EGL_ICD_JSON":
        base = PurePosixPath("/usr/share/glvnd/egl_vendor.d")
    else:
        return None
    return base / _relative(name, entry)


def _relative(path: str, entry: ManifestEntry) -> PurePosixPath:
    relative = PurePosixPath(path.strip("/") or ".")
    if ".." in relative.parts:
        raise DriverError(
            f".manifest line {entry.line} points outside its directory ({path!r}): the package "
            "is corrupt or not genuine"
        )
    return relative


def _require(manifest: Manifest, planned: Iterable[PlannedFile]) -> None:
    files = [item.entry.name for item in planned if not item.entry.is_symlink]
    present = set(files) | {library_name(name) for name in files}
    missing = [name for name in REQUIRED if name not in present]
    if missing:
        raise DriverError(
            f"the NVIDIA {manifest.version} package's .manifest lists no {', '.join(missing)}: "
            "it is not a complete Linux driver package; use NVIDIA-Linux-<arch>-<version>.run"
        )


# --- all-or-nothing installation -------------------------------------------------------------

STAGED_SUFFIX = ".nvidia-staged"
REPLACED_SUFFIX = ".nvidia-replaced"


@dataclass
class _Transaction:
    """Files written beside their destinations under temporary names, then renamed into place.

    Renames within a directory are atomic, so a reader sees the old file or the new one. What a
    commit replaces is kept (a hard link, or the renamed directory) until the transaction
    ends, so a rollback after the commit restores it.
    """

    staged: list[tuple[Path, Path]] = field(default_factory=list)  # (temporary, final)
    committed: list[tuple[Path, Path | None]] = field(default_factory=list)  # (final, backup)
    created_dirs: list[Path] = field(default_factory=list)

    def directory(self, path: Path) -> None:
        missing: list[Path] = []
        while not path.exists():
            missing.append(path)
            path = path.parent
        for directory in reversed(missing):
            directory.mkdir()
            self.created_dirs.append(directory)

    def stage_file(self, source: Path, final: Path, mode: int) -> None:
        self.directory(final.parent)
        handle, temporary = tempfile.mkstemp(
            prefix=f".{final.name}.", suffix=STAGED_SUFFIX, dir=final.parent
        )
        self.staged.append((Path(temporary), final))
        with os.fdopen(handle, "wb") as out, source.open("rb") as data:
            shutil.copyfileobj(data, out, 1 << 20)
        # After writing: a write clears setuid, and nvidia-modprobe keeps its 04755.
        Path(temporary).chmod(mode)
        stat = source.stat()
        os.utime(temporary, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    def stage_symlink(self, target: str, final: Path) -> None:
        self.directory(final.parent)
        temporary = final.with_name(f".{final.name}.{secrets.token_hex(4)}{STAGED_SUFFIX}")
        temporary.symlink_to(target)
        self.staged.append((temporary, final))

    def stage_directory(self, final: Path) -> Path:
        self.directory(final.parent)
        temporary = Path(
            tempfile.mkdtemp(prefix=f".{final.name}.", suffix=STAGED_SUFFIX, dir=final.parent)
        )
        self.staged.append((temporary, final))
        temporary.chmod(0o755)
        return temporary

    def commit(self) -> None:
        for temporary, final in self.staged:
            self.committed.append((final, _set_aside(final)))
            temporary.replace(final)

    def rollback(self) -> None:
        for final, backup in reversed(self.committed):
            _quietly(final, partial(_remove, final))
            if backup is not None:
                _quietly(final, partial(backup.replace, final))
        for temporary, _ in self.staged:
            _quietly(temporary, partial(_remove, temporary))
        for directory in reversed(self.created_dirs):
            _quietly(directory, directory.rmdir)

    def discard_backups(self) -> None:
        for _, backup in self.committed:
            if backup is not None:
                _quietly(backup, partial(_remove, backup))


def _set_aside(final: Path) -> Path | None:
    """Keep what ``final`` holds under another name; None if there is nothing."""
    if not os.path.lexists(final):
        return None
    backup = final.with_name(f".{final.name}.{secrets.token_hex(4)}{REPLACED_SUFFIX}")
    if final.is_dir() and not final.is_symlink():
        final.rename(backup)  # a directory cannot be linked: rename it out of the way
    else:
        os.link(final, backup, follow_symlinks=False)  # final stays until replaced atomically
    return backup


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _quietly(path: Path, action: Callable[[], object]) -> None:
    """Cleanup keeps going: one path it cannot restore must not hide the original error."""
    try:
        action()
    except OSError as exc:
        warn(f"could not clean up {path}: {exc.strerror}")


@contextmanager
def _transaction() -> Iterator[_Transaction]:
    transaction = _Transaction()
    try:
        yield transaction
    except BaseException:
        transaction.rollback()
        raise
    transaction.discard_backups()


# --- install ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class InstalledGroup:
    title: str
    files: tuple[PurePosixPath, ...]  # absolute paths inside the root
    symlinks: tuple[PurePosixPath, ...] = ()

    def summary(self) -> str:
        names = ", ".join(path.name for path in self.files)
        count = len(self.symlinks)
        links = f" (+{count} symlink{'s' if count > 1 else ''})" if count else ""
        return f"Installed {self.title}: {names}{links}"


@dataclass(frozen=True)
class InstallResult:
    version: str
    root: Path
    groups: tuple[InstalledGroup, ...]


def host_arch() -> str:
    machine = platform.machine()
    for arch, name in MACHINES.items():
        if name == machine:
            return arch
    raise DriverError(f"no NVIDIA driver userspace for this machine ({machine}); use --arch")


def _known_arch(arch: str) -> str:
    if arch not in TRIPLETS:
        raise DriverError(f"unknown architecture {arch!r}: use one of {', '.join(TRIPLETS)}")
    return arch


def install_runfile(
    runfile: Path,
    root: Path = Path("/"),
    *,
    arch: str | None = None,
    sha256: str | None = None,
    commands: Commands | None = None,
    man_pages: bool = True,
) -> InstallResult:
    """Verify and unpack ``runfile`` in a scratch directory, then install from it into ``root``."""
    arch = _known_arch(arch or host_arch())
    header = run.read_header(runfile)
    if header.target_arch not in (None, MACHINES[arch]):
        raise DriverError(
            f"{runfile.name} is for {header.target_arch}, not {MACHINES[arch]} ({arch}); "
            "use the .run for the image's architecture"
        )
    commands = commands or Commands()
    say(f"Unpacking {runfile.name}...")
    with tempfile.TemporaryDirectory(prefix="nvidia-run.") as scratch:
        tree = run.extract(runfile, Path(scratch) / "package", commands=commands, sha256=sha256)
        result = install_tree(tree, root, arch=arch, commands=commands, man_pages=man_pages)
    if header.version not in (None, result.version):
        warn(f"{runfile.name} says version {header.version}, its .manifest {result.version}")
    return result


def install_tree(
    tree: Path,
    root: Path = Path("/"),
    *,
    arch: str,
    commands: Commands,
    man_pages: bool = True,
) -> InstallResult:
    """Install from an unpacked .run tree into ``root``: all of it, or nothing on failure."""
    manifest_text = _read_manifest(tree)
    manifest = parse_manifest(manifest_text)
    layout = Layout(TRIPLETS[_known_arch(arch)], manifest.version)
    planned = plan(manifest, layout, man_pages)
    _check_sources(tree, planned)
    kernel_dirs = [name for name in KERNEL_SOURCE_DIRS if (tree / name).is_dir()]
    if not kernel_dirs:
        raise DriverError(
            f"the NVIDIA {manifest.version} package has neither kernel/ nor kernel-open/: it "
            "is not a complete Linux driver package"
        )
    root = root.resolve()
    say(f"Installing the NVIDIA {manifest.version} userspace into {root}...")
    try:
        with _transaction() as transaction:
            for item in planned:
                _stage(transaction, tree, root, item)
            sources = _stage_sources(
                transaction,
                tree,
                root,
                layout=layout,
                kernel_dirs=kernel_dirs,
                manifest_text=manifest_text,
            )
            transaction.directory(root / "etc")  # where ldconfig -r writes its cache
            transaction.commit()
            _update_linker_cache(root, commands)
    except (OSError, DriverError) as exc:  # DriverError: ldconfig
        raise DriverError(
            f"installing the NVIDIA {manifest.version} userspace into {root} failed "
            f"({exc}); nothing was installed"
        ) from exc
    result = InstallResult(manifest.version, root, (*_groups(planned), sources))
    for group in result.groups:
        say(group.summary())
    return result


def _read_manifest(tree: Path) -> str:
    try:
        return (tree / MANIFEST).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as exc:
        raise DriverError(
            f"the driver package has no readable {MANIFEST} ({exc.strerror}): it is not an "
            "NVIDIA driver .run"
        ) from exc


def _source(tree: Path, entry: ManifestEntry) -> Path:
    return tree / _relative(entry.file, entry)


def _check_sources(tree: Path, planned: list[PlannedFile]) -> None:
    for item in planned:
        if not item.entry.is_symlink and not _source(tree, item.entry).is_file():
            raise DriverError(
                f".manifest line {item.entry.line} lists {item.entry.file}, which the package "
                "does not have: the package is corrupt; download it again"
            )


def _in_root(root: Path, path: PurePosixPath) -> Path:
    return root / path.relative_to("/")


def _stage(transaction: _Transaction, tree: Path, root: Path, item: PlannedFile) -> None:
    final = _in_root(root, item.destination)
    if item.entry.is_symlink:
        assert item.entry.target is not None  # parse_manifest requires it for symlink types
        transaction.stage_symlink(item.entry.target, final)
    else:
        transaction.stage_file(_source(tree, item.entry), final, _install_mode(item.entry))


def _install_mode(entry: ManifestEntry) -> int:
    """The entry's mode; setuid and setgid only for nvidia-modprobe, as nvidia-installer has it."""
    if not entry.mode & _PRIVILEGE_BITS or PurePosixPath(entry.file).name == SETUID_PROGRAM:
        return entry.mode
    mode = entry.mode & ~_PRIVILEGE_BITS
    warn(
        f".manifest line {entry.line}: {entry.file} asks for mode {entry.mode:04o}; only "
        f"{SETUID_PROGRAM} may be setuid or setgid: installing it {mode:04o}"
    )
    return mode


def _stage_sources(
    transaction: _Transaction,
    tree: Path,
    root: Path,
    *,
    layout: Layout,
    kernel_dirs: list[str],
    manifest_text: str,
) -> InstalledGroup:
    """/usr/src/nvidia-<version>: the module sources, LICENSE and the trimmed manifest."""
    staging = transaction.stage_directory(_in_root(root, layout.sources_dir))
    names = list(kernel_dirs)
    for name in kernel_dirs:
        shutil.copytree(tree / name, staging / name, symlinks=True)
    if (tree / "LICENSE").is_file():
        shutil.copy2(tree / "LICENSE", staging / "LICENSE")
        names.append("LICENSE")
    (staging / MANIFEST).write_text(
        trimmed_manifest(manifest_text), encoding="utf-8", errors="surrogateescape"
    )
    names.append(MANIFEST)
    return InstalledGroup(
        f"{SOURCES_GROUP} in {layout.sources_dir}",
        tuple(layout.sources_dir / name for name in names),
    )


def _update_linker_cache(root: Path, commands: Commands) -> None:
    # ldconfig also creates SONAME links the manifest lacks. -r chroots, so only for a root
    # other than the running system's.
    if root == Path("/"):
        commands.run("ldconfig")
    else:
        commands.run("ldconfig", "-r", root)


def _groups(planned: list[PlannedFile]) -> list[InstalledGroup]:
    order = [group.title for group in GROUPS] + [FIRMWARE_GROUP, MAN_PAGES_GROUP]
    groups = []
    for title in order:
        members = [item for item in planned if item.group == title]
        if members:
            groups.append(
                InstalledGroup(
                    title,
                    tuple(m.destination for m in members if not m.entry.is_symlink),
                    tuple(m.destination for m in members if m.entry.is_symlink),
                )
            )
    return groups


# --- command line ----------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    main_parser = argparse.ArgumentParser(
        prog="python3 -m nvidia_driver.userspace",
        description="Install the NVIDIA driver userspace a headless node needs from a .run, "
        "without nvidia-installer (image build time).",
    )
    commands = main_parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    install = commands.add_parser(
        "install", help="verify, unpack and install a driver .run into a root directory"
    )
    install.add_argument("--run", type=Path, required=True, metavar="FILE", help="the .run")
    install.add_argument("--sha256", metavar="HEX", help="the .run's pinned SHA-256")
    install.add_argument(
        "--root", type=Path, default=Path("/"), metavar="DIR", help="install under DIR (/)"
    )
    install.add_argument(
        "--arch", choices=sorted(TRIPLETS), help="the image's architecture (default: this host's)"
    )
    install.add_argument("--no-man-pages", action="store_true", help="skip the man pages")
    return main_parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        install_runfile(
            args.run,
            args.root,
            arch=args.arch,
            sha256=args.sha256,
            man_pages=not args.no_man_pages,
        )
    except DriverError as exc:
        error(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
