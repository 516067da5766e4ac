"""A small unpacked NVIDIA driver package (the tree a .run extracts to), built at test time.

Every file is a few bytes of text; the .manifest is written from the same list, in the real
format (docs/nvidia-run-format.md section 3). The list mixes what a headless node
gets with what it must not: X11/desktop, 32-bit, installer-internal and systemd files, and one
line of each kind the .manifest may hold.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path

V = "535.999.01"
LIBDIR = "usr/lib/x86_64-linux-gnu"


@dataclass(frozen=True)
class Part:
    """One manifest entry; regular files (mode != 0) also get a file in the tree."""

    path: str
    mode: int
    fields: str  # between the mode and the MODULE: tag
    module: str = "test"

    @property
    def line(self) -> str:
        mode = f"0{self.mode:o}" if self.mode >= 0o1000 else f"{self.mode:04o}"
        return f"{self.path} {mode} {self.fields} MODULE:{self.module}"


PARTS: tuple[Part, ...] = (
    Part(f"libnvidia-ml.so.{V}", 0o755, "CUDA_LIB NATIVE /", "nvml"),
    Part("libnvidia-ml.so.1", 0, f"CUDA_SYMLINK NATIVE / libnvidia-ml.so.{V}", "nvml"),
    Part("libnvidia-ml.so", 0, "CUDA_SYMLINK NATIVE / libnvidia-ml.so.1", "nvml"),
    Part(f"libnvidia-cfg.so.{V}", 0o755, "UTILITY_LIB NATIVE", "installer"),
    Part("libnvidia-cfg.so.1", 0, f"UTILITY_LIB_SYMLINK NATIVE libnvidia-cfg.so.{V}"),
    Part(f"libcuda.so.{V}", 0o755, "CUDA_LIB NATIVE /", "gpgpu"),
    Part("libcuda.so.1", 0, f"CUDA_SYMLINK NATIVE / libcuda.so.{V}", "gpgpu"),
    Part(f"libnvidia-ptxjitcompiler.so.{V}", 0o755, "CUDA_LIB NATIVE /", "gpgpu"),
    Part(f"libnvidia-gpucomp.so.{V}", 0o755, "CUDA_LIB NATIVE /", "gpgpu"),
    Part(f"libnvidia-opencl.so.{V}", 0o755, "OPENCL_LIB NATIVE /", "gpgpu"),
    Part("libnvidia-opencl.so.1", 0, f"OPENCL_LIB_SYMLINK NATIVE / libnvidia-opencl.so.{V}"),
    Part("nvidia.icd", 0o644, "CUDA_ICD", "gpgpu"),
    Part(f"libEGL_nvidia.so.{V}", 0o755, "OPENGL_LIB NATIVE", "egl"),
    Part("libEGL_nvidia.so.0", 0, f"OPENGL_SYMLINK NATIVE libEGL_nvidia.so.{V}", "egl"),
    Part(f"libGLX_nvidia.so.{V}", 0o755, "OPENGL_LIB NATIVE", "opengl"),
    Part("libGLX_nvidia.so.0", 0, f"OPENGL_SYMLINK NATIVE libGLX_nvidia.so.{V}", "opengl"),
    Part("nvidia_icd.json", 0o644, "VULKAN_ICD_JSON icd.d/", "opengl"),
    Part("10_nvidia.json", 0o644, "GLVND_EGL_ICD_JSON", "egl"),
    Part("nvidia-smi", 0o755, "UTILITY_BINARY", "nvml"),
    Part("nvidia-smi.1.gz", 0o444, "MANPAGE man1/", "nvml"),
    Part("nvidia-debugdump", 0o755, "UTILITY_BINARY", "nvml"),
    Part("nvidia-persistenced", 0o755, "UTILITY_BINARY", "nvpd"),
    Part("nvidia-modprobe", 0o4755, "NVIDIA_MODPROBE /usr/bin/", "installer"),
    Part("nvidia-modprobe.1.gz", 0o444, "NVIDIA_MODPROBE_MANPAGE man1/", "installer"),
    Part("nvidia-cuda-mps-control", 0o755, "UTILITY_BINARY", "gpgpu"),
    Part("nvidia-cuda-mps-server", 0o755, "UTILITY_BINARY", "gpgpu"),
    Part(f"libnvcuvid.so.{V}", 0o755, "NVCUVID_LIB NATIVE", "nvcuvid"),
    Part("libnvcuvid.so.1", 0, f"NVCUVID_LIB_SYMLINK NATIVE libnvcuvid.so.{V}", "nvcuvid"),
    Part(f"libnvidia-fbc.so.{V}", 0o755, "UTILITY_LIB NATIVE", "nvfbc"),
    Part("libnvidia-fbc.so.1", 0, f"UTILITY_LIB_SYMLINK NATIVE libnvidia-fbc.so.{V}", "nvfbc"),
    Part("firmware/gsp_ga10x.bin", 0o644, "FIRMWARE INHERIT_PATH_DEPTH:1", "gsp"),
    Part("firmware/gsp_tu10x.bin", 0o644, "FIRMWARE INHERIT_PATH_DEPTH:1", "gsp"),
    # What a headless compute node does not get.
    Part("libnvidia-api.so.1", 0o755, "UTILITY_LIB NATIVE", "nvml"),
    Part(f"libnvidia-gtk3.so.{V}", 0o755, "UTILITY_LIB NATIVE", "xutils"),
    Part(f"libglxserver_nvidia.so.{V}", 0o755, "GLX_MODULE_SHARED_LIB extensions/", "xdriver"),
    Part("nvidia_drv.so", 0o755, "XMODULE_SHARED_LIB drivers/", "xdriver"),
    Part("nvidia-settings", 0o755, "UTILITY_BINARY", "xutils"),
    Part("nvidia-settings.1.gz", 0o444, "MANPAGE man1/", "xutils"),
    Part("nvidia-installer", 0o755, "INSTALLER_BINARY", "installer"),
    Part("nvidia-uninstall", 0, "UTILITY_BIN_SYMLINK nvidia-installer", "installer"),
    Part(f"32/libcuda.so.{V}", 0o755, "CUDA_LIB COMPAT32 /", "gpgpu"),
    Part("libcuda.so.1", 0, f"CUDA_SYMLINK COMPAT32 / libcuda.so.{V}", "gpgpu"),
    Part("10_nvidia_wayland.json", 0o644, "EGL_EXTERNAL_PLATFORM_JSON", "egl"),
    Part("systemd/system/nvidia-suspend.service", 0o644, "SYSTEMD_UNIT", "powerd"),
    Part("nvidia-suspend.service", 0, "SYSTEMD_UNIT_SYMLINK systemd/system/suspend.target.wants/"),
    Part("html/index.html", 0o444, "DOCUMENTATION NVIDIA_GLX-1.0/html", "installer"),
    Part("LICENSE", 0o644, "DOCUMENTATION NVIDIA_GLX-1.0", "installer"),
    Part("kernel/Kbuild", 0o644, "KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1", "resman"),
    Part("kernel/dkms.conf", 0o644, "DKMS_CONF INHERIT_PATH_DEPTH:1", "resman"),
    Part("kernel/nvidia/nv.c", 0o644, "KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1", "resman"),
    Part("kernel/nvidia/nv-kernel.o_binary", 0o644, "KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1"),
    Part("kernel/conftest.sh", 0o755, "KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1", "resman"),
    Part("kernel-open/Kbuild", 0o644, "KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1", "resman"),
    Part("kernel-open/nvidia-uvm/hwref/volta/gv100/dev_mmu.h", 0o644,
         "KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1", "uvm"),
)  # fmt: skip

HEADER = (
    "NVIDIA Accelerated Graphics Driver for Linux-x86_64",
    V,
    " ",
    "nvidia nvidia-uvm nvidia-modeset nvidia-drm nvidia-peermem ",
    " ",
    " ",
    "./kernel/",
    "./kernel/precompiled/",
)

# Everything a headless install puts outside /usr/src, as (path in root, mode or link target).
EXPECTED_FILES: dict[str, int | str] = {
    f"{LIBDIR}/libnvidia-ml.so.{V}": 0o755,
    f"{LIBDIR}/libnvidia-ml.so.1": f"libnvidia-ml.so.{V}",
    f"{LIBDIR}/libnvidia-ml.so": "libnvidia-ml.so.1",
    f"{LIBDIR}/libnvidia-cfg.so.{V}": 0o755,
    f"{LIBDIR}/libnvidia-cfg.so.1": f"libnvidia-cfg.so.{V}",
    f"{LIBDIR}/libcuda.so.{V}": 0o755,
    f"{LIBDIR}/libcuda.so.1": f"libcuda.so.{V}",
    f"{LIBDIR}/libnvidia-ptxjitcompiler.so.{V}": 0o755,
    f"{LIBDIR}/libnvidia-gpucomp.so.{V}": 0o755,
    f"{LIBDIR}/libnvidia-opencl.so.{V}": 0o755,
    f"{LIBDIR}/libnvidia-opencl.so.1": f"libnvidia-opencl.so.{V}",
    f"{LIBDIR}/libnvcuvid.so.{V}": 0o755,
    f"{LIBDIR}/libnvcuvid.so.1": f"libnvcuvid.so.{V}",
    f"{LIBDIR}/libnvidia-fbc.so.{V}": 0o755,
    f"{LIBDIR}/libnvidia-fbc.so.1": f"libnvidia-fbc.so.{V}",
    f"{LIBDIR}/libEGL_nvidia.so.{V}": 0o755,
    f"{LIBDIR}/libEGL_nvidia.so.0": f"libEGL_nvidia.so.{V}",
    f"{LIBDIR}/libGLX_nvidia.so.{V}": 0o755,
    f"{LIBDIR}/libGLX_nvidia.so.0": f"libGLX_nvidia.so.{V}",
    "etc/OpenCL/vendors/nvidia.icd": 0o644,
    "etc/vulkan/icd.d/nvidia_icd.json": 0o644,
    "usr/share/glvnd/egl_vendor.d/10_nvidia.json": 0o644,
    "usr/bin/nvidia-smi": 0o755,
    "usr/bin/nvidia-debugdump": 0o755,
    "usr/bin/nvidia-persistenced": 0o755,
    "usr/bin/nvidia-modprobe": 0o4755,
    "usr/bin/nvidia-cuda-mps-control": 0o755,
    "usr/bin/nvidia-cuda-mps-server": 0o755,
    "usr/share/man/man1/nvidia-smi.1.gz": 0o444,
    "usr/share/man/man1/nvidia-modprobe.1.gz": 0o444,
    f"opt/lib/firmware/nvidia/{V}/gsp_ga10x.bin": 0o644,
    f"opt/lib/firmware/nvidia/{V}/gsp_tu10x.bin": 0o644,
}
KERNEL_SOURCES = {
    "kernel/Kbuild",
    "kernel/dkms.conf",
    "kernel/nvidia/nv.c",
    "kernel/nvidia/nv-kernel.o_binary",
    "kernel/conftest.sh",
    "kernel-open/Kbuild",
    "kernel-open/nvidia-uvm/hwref/volta/gv100/dev_mmu.h",
}


def content_of(path: str) -> bytes:
    return f"fake {path}\n".encode()


def manifest_text(parts: tuple[Part, ...] = PARTS) -> str:
    return "".join(f"{line}\n" for line in (*HEADER, *(part.line for part in parts)))


def make_package(tree: Path, parts: tuple[Part, ...] = PARTS, manifest: str | None = None) -> Path:
    """Lay out ``parts`` under ``tree`` as an extracted .run; return ``tree``."""
    for part in parts:
        if part.mode == 0:
            continue  # symlinks exist only as manifest entries
        path = tree / part.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content_of(part.path))
        path.chmod(part.mode & 0o777)  # as extracted: the "data" filter drops setuid
    (tree / ".manifest").write_text(manifest if manifest is not None else manifest_text(parts))
    return tree


def without(*paths: str) -> tuple[Part, ...]:
    return tuple(part for part in PARTS if part.path not in paths)


def installed(root: Path) -> dict[str, int | str]:
    """What is under ``root`` outside /usr/src and /etc/ld.so.cache: mode or link target."""
    found: dict[str, int | str] = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith("usr/src") or (path.is_dir() and not path.is_symlink()):
            continue
        if path.is_symlink():
            found[relative] = str(path.readlink())
        else:
            found[relative] = stat.S_IMODE(path.lstat().st_mode)
    return found
