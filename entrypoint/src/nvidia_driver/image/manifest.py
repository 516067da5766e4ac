"""The .manifest of an NVIDIA driver .run: what it installs, of which type, and where.

Its format is nvidia-installer's (docs/nvidia-run-format.md section 3): 8 header
lines, then one entry a line, ``file mode TYPE [arch] [path | INHERIT_PATH_DEPTH:N] [target]
MODULE:m``, up to the first empty line. Each TYPE has its own optional fields (FILE_TYPES).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from itertools import takewhile
from pathlib import PurePosixPath

from nvidia_driver.errors import DriverError
from nvidia_driver.log import warn

MANIFEST = ".manifest"
MANIFEST_HEADER_LINES = 8
ARCHES = ("NATIVE", "COMPAT32")
TLS_CLASSES = ("CLASSIC", "NEW")  # a field of TLS_LIB/TLS_SYMLINK up to 410.73
INHERIT_PREFIX = "INHERIT_PATH_DEPTH:"
MODULE_PREFIX = "MODULE:"
MAX_MODE = 0o7777
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


def relative_path(path: str, entry: ManifestEntry) -> PurePosixPath:
    relative = PurePosixPath(path.strip("/") or ".")
    if ".." in relative.parts:
        raise DriverError(
            f".manifest line {entry.line} points outside its directory ({path!r}): the package "
            "is corrupt or not genuine"
        )
    return relative
