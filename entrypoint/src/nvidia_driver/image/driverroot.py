"""The driver root NVIDIA's container toolkit expects, as recorded in ``driver-root.toml``.

Two checks at image build, so that a new NVIDIA release cannot lose a library unnoticed:

* every ``.manifest`` entry is claimed by an install group (userspace.py) or excluded by a
  recorded rule, with its reason (:func:`exclusion`);
* after all provisioning steps, every name the toolkit injects that is required for the
  driver's branch is installed: binaries in /usr/bin, libraries under the library directory
  with their SONAME link in the linker cache (:func:`verify_root`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.log import say
from nvidia_driver.naming import TRIPLETS

DATA_FILE = "driver-root.toml"
REQUIRED, OPTIONAL, EXCLUDED = "required", "optional", "excluded"
COMPAT32_REASON = "32-bit libraries: a compute node runs no 32-bit CUDA or graphics"
_MAX_LISTED = 5


@dataclass(frozen=True)
class ToolkitName:
    """One library (named up to ".so") or binary of the toolkit's lists."""

    name: str
    toolkit_list: str
    status: str
    origin: str = ""  # "run" or a redistrib_<version>.json component
    reason: str = ""
    since: int | None = None
    until: int | None = None
    arches: tuple[str, ...] = ()  # the image architectures whose .run ships it; () for all

    @property
    def is_library(self) -> bool:
        return self.name.startswith("lib")

    def shipped_by(self, branch: int) -> bool:
        """Whether NVIDIA ships it for this driver branch (by the recorded since/until)."""
        return (self.since is None or branch >= self.since) and (
            self.until is None or branch <= self.until
        )

    def required_for(self, branch: int, arch: str) -> bool:
        on_arch = not self.arches or arch in self.arches
        return self.status == REQUIRED and self.shipped_by(branch) and on_arch


@dataclass(frozen=True)
class Rules:
    names: tuple[ToolkitName, ...]
    excluded_types: Mapping[str, str]
    excluded_names: Mapping[str, str]

    def named(self, name: str) -> ToolkitName | None:
        return next((entry for entry in self.names if entry.name == name), None)


def _toolkit_name(name: str, toolkit_list: str, fields: Mapping[str, Any]) -> ToolkitName:
    if "excluded" in fields:
        status, reason = EXCLUDED, str(fields["excluded"])
    elif "optional" in fields:
        status, reason = OPTIONAL, str(fields["optional"])
    else:
        status, reason = REQUIRED, ""
    since, until = fields.get("since"), fields.get("until")
    arches = fields.get("arches", [])
    return ToolkitName(
        name=name,
        toolkit_list=toolkit_list,
        status=status,
        origin=str(fields.get("origin", "")),
        reason=reason,
        since=since if isinstance(since, int) else None,
        until=until if isinstance(until, int) else None,
        arches=tuple(str(arch) for arch in arches) if isinstance(arches, list) else (),
    )


def parse_rules(data: Mapping[str, Any]) -> Rules:
    names = [
        _toolkit_name(name, toolkit_list, fields)
        for toolkit_list, entries in data.get("toolkit", {}).items()
        for name, fields in entries.items()
    ]
    manifest = data.get("manifest", {})
    return Rules(
        tuple(names),
        dict(manifest.get("excluded_types", {})),
        dict(manifest.get("excluded_names", {})),
    )


@cache
def rules() -> Rules:
    """The recorded rules shipped in the package."""
    text = resources.files("nvidia_driver.image").joinpath(DATA_FILE).read_text(encoding="utf-8")
    return parse_rules(tomllib.loads(text))


def library_name(file_name: str) -> str | None:
    """``libcuda.so.580.1`` -> ``libcuda``; None for a file that is not a shared library."""
    if file_name.startswith("lib") and ".so" in file_name:
        return file_name.split(".so", 1)[0]
    return None


def exclusion(file_name: str, file_type: str, arch: str | None = None) -> str | None:
    """Why a .manifest entry is not installed on a headless node; None if no rule says so."""
    if arch == "COMPAT32":
        return COMPAT32_REASON
    recorded = rules()
    base = library_name(file_name) or file_name
    for key in (file_name, base, base.removesuffix(".so")):
        if key in recorded.excluded_names:
            return recorded.excluded_names[key]
        toolkit = recorded.named(key)
        if toolkit is not None and toolkit.status == EXCLUDED:
            return toolkit.reason
    return recorded.excluded_types.get(file_type)


def unclaimed_error(version: str, entries: Iterable[tuple[int, str, str]]) -> DriverError:
    """One line naming the .manifest entries (line, file, type) nothing claims or excludes."""
    listed = list(entries)
    shown = ", ".join(
        f"{file} ({file_type}, line {line})" for line, file, file_type in listed[:_MAX_LISTED]
    )
    if len(listed) > _MAX_LISTED:
        shown += f" and {len(listed) - _MAX_LISTED} more"
    return DriverError(
        f"the NVIDIA {version} .manifest lists {shown}, which no install group claims and no "
        "rule excludes: add it to an install group (userspace.py) or, with the reason, to "
        "driver-root.toml; nothing was installed"
    )


# --- the installed root -------------------------------------------------------------------------


def ldconfig_root(root: Path) -> list[str]:
    """ldconfig's arguments for root: -r chroots, so only for a root other than the system's."""
    return [] if root == Path("/") else ["-r", str(root)]


def _linker_cache(root: Path, commands: Commands) -> set[str]:
    """The library names (SONAMEs) in root's /etc/ld.so.cache."""
    listing = commands.run("ldconfig", *ldconfig_root(root), "-p").stdout
    return {line.split()[0] for line in listing.splitlines()[1:] if line.strip()}


def _library_files(libdir: Path) -> dict[str, list[Path]]:
    """Shared libraries under libdir and its direct subdirectories (vdpau/), by name."""
    found: dict[str, list[Path]] = {}
    for directory in [libdir, *(d for d in libdir.iterdir() if d.is_dir())]:
        for path in directory.iterdir():
            name = library_name(path.name)
            if name is not None and (path.is_file() or path.is_symlink()):
                found.setdefault(name, []).append(path)
    return found


def missing_names(root: Path, arch: str, branch: int, commands: Commands) -> list[str]:
    """The required names of this branch and arch that ``root`` lacks, with what is missing."""
    libdir = PurePosixPath("/usr/lib", TRIPLETS[arch])
    libraries = _library_files(root / libdir.relative_to("/"))
    cached = _linker_cache(root, commands)
    missing = []
    for entry in rules().names:
        if not entry.required_for(branch, arch):
            continue
        if not entry.is_library:
            binary = root / "usr/bin" / entry.name
            if not binary.is_file():
                missing.append(f"{entry.name} (/usr/bin)")
            continue
        files = [path for path in libraries.get(entry.name, []) if not path.is_symlink()]
        if not files:
            missing.append(f"{entry.name} ({libdir})")
            continue
        # Libraries in a subdirectory (vdpau/) are opened by path, not through the cache.
        in_libdir = any(path.parent == root / libdir.relative_to("/") for path in files)
        if in_libdir and not any(name.startswith(f"{entry.name}.so.") for name in cached):
            missing.append(f"{entry.name} (no SONAME link in the linker cache)")
    return missing


def verify_root(root: Path, arch: str, version: str, commands: Commands) -> list[ToolkitName]:
    """Refuse a driver root without a required name; return the names checked."""
    branch = int(version.split(".", 1)[0])
    missing = missing_names(root, arch, branch, commands)
    if missing:
        raise DriverError(
            f"the driver root lacks {', '.join(missing)}, which NVIDIA's container toolkit "
            f"injects for driver {version}: the .run or a redist archive no longer ships it, or "
            "an install group lost it; see driver-root.toml"
        )
    checked = [entry for entry in rules().names if entry.required_for(branch, arch)]
    say(f"Driver root complete: {len(checked)} names the container toolkit injects are installed")
    return checked
