"""What a headless compute node gets of a driver .run, and where nvidia-installer would put it.

Files are picked by basename (the manifest's TYPE does not separate compute from graphics) and
the TYPE decides where they go (docs/nvidia-run-format.md section 4); every entry is installed
by a group or excluded by a rule of driver-root.toml.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

from nvidia_driver.errors import DriverError
from nvidia_driver.image.driverroot import exclusion, library_name, unclaimed_error
from nvidia_driver.image.manifest import Manifest, ManifestEntry, relative_path
from nvidia_driver.log import warn
from nvidia_driver.paths import IMAGE_FIRMWARE_DIR


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
    "libnvcuextend",  # dlopened by libcuda at cuInit; aarch64 .run from 610 (negativo17 spec)
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
    groups = (group for group in GROUPS if entry.name in group.files or library in group.libraries)
    return next((group.title for group in groups), None)


def _destination(entry: ManifestEntry, layout: Layout) -> PurePosixPath | None:
    """Where nvidia-installer would put ``entry`` (reference section 3.3), or None."""
    file_type, name = entry.file_type, entry.name
    if file_type in LIBRARY_TYPES:
        base = layout.libdir / relative_path(entry.path or "", entry)
    elif file_type in BINARY_TYPES:
        base = PurePosixPath("/usr/bin")
    elif file_type in ABSOLUTE_PATH_TYPES:
        base = PurePosixPath("/") / relative_path(entry.path or "/usr/bin", entry)
    elif file_type in MAN_PAGE_TYPES:
        base = PurePosixPath("/usr/share/man") / relative_path(entry.path or "man1", entry)
    elif file_type == "CUDA_ICD":
        base = PurePosixPath("/etc/OpenCL/vendors")
    elif file_type == "FIRMWARE":
        base = layout.firmware_dir / relative_path(entry.inherited_dir or "", entry)
    elif file_type == "VULKAN_ICD_JSON":
        base = PurePosixPath("/etc/vulkan") / relative_path(entry.path or "icd.d", entry)
    elif file_type == "GLVND_EGL_ICD_JSON":
        base = PurePosixPath("/usr/share/glvnd/egl_vendor.d")
    else:
        return None
    return base / relative_path(name, entry)


def _require(manifest: Manifest, planned: Iterable[PlannedFile]) -> None:
    files = [item.entry.name for item in planned if not item.entry.is_symlink]
    present = set(files) | {library_name(name) for name in files}
    missing = [name for name in REQUIRED if name not in present]
    if missing:
        raise DriverError(
            f"the NVIDIA {manifest.version} package's .manifest lists no {', '.join(missing)}: "
            "it is not a complete Linux driver package; use NVIDIA-Linux-<arch>-<version>.run"
        )
