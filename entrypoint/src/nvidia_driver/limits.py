"""The bounds the readers of downloads and host files keep, in one place (docs/security.md).

Each bound sits well above what the real input needs (the figures in the comments) and low
enough that a crafted input is refused, with one line naming the artifact and the bound, before
it exhausts the node's memory, disk or time. The readers look these up when they run.
"""

from __future__ import annotations

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# flatcar-container.tar.gz: 377 MiB of gzip, a whole root file system. What is written is the
# kernel's build/source tree (~300 MB in a real release) and the shared libraries of the
# library directories, of which the tools' closure is kept. The integration fixture made from
# Debian (135 MB of gzip, 21,381 members inflating to 369 MB) writes 130 MB in 13,708 entries,
# its largest file 8.2 MB (libasan).
CONTAINER_INFLATED = 8 * GiB  # the whole archive, inflated (read and mostly skipped)
CONTAINER_WRITTEN = 2 * GiB  # the bytes of every file written
CONTAINER_MEMBER = 256 * MiB  # one file written
CONTAINER_ENTRIES = 200_000  # files, links and directories written
TAR_METADATA = 1 * MiB  # the pax and GNU long-name headers of one member, together

# NVIDIA-Linux-<arch>-<version>.run: ~400 MB of xz or zstd, one tar stream. 610.57.04 unpacks to
# 1,189 members and 1.8 GB (docs/nvidia-run-format.md section 1.4); the integration fixture's
# 550.163.01, made of Debian's packages, to 977 members and 939 MB, its largest file 223 MB
# (kernel-open/nvidia/nv-kernel.o_binary).
RUN_INFLATED = 16 * GiB  # the tar stream: the files and their headers
RUN_WRITTEN = 8 * GiB  # the bytes of every file written
RUN_MEMBER = 2 * GiB  # one file written
RUN_ENTRIES = 100_000  # files, links and directories written

# NVIDIA's redist archives (fabric manager, NSCQ, NVLSM, IMEX, NVSDM): .tar.xz, verified against
# their recorded SHA-256 before they are read; these bounds sit far above any of them.
REDIST_INFLATED = 4 * GiB  # the tar stream: the files and their headers
REDIST_WRITTEN = 2 * GiB  # the bytes of every member
REDIST_MEMBER = 1 * GiB  # one member
REDIST_ENTRIES = 20_000  # members

# Paths: a kernel tree's deepest is ~12 components; PATH_MAX (4096) allows ~2,000.
PATH_DEPTH = 128
LINK_TARGET = 4095  # bytes: PATH_MAX without its NUL

# flatcar_developer_container.bin.bz2: ~480 MB of bzip2, a 6 GiB GPT disk, written sparse, whose
# ext4 partition debugfs extracts (partx reads the GPT).
DISK_IMAGE = 12 * GiB  # the decompressed disk image, holes included
EXT4_ENTRIES = 1_000_000  # extracted; a 6 GiB ext4 at mke2fs's default ratio has 393,216 inodes
DEBUGFS_SECONDS = 30 * 60  # debugfs's rdump of the wanted paths (a few GB, at ~0.3 GB/s)

# flatcar_production_image.vmlinuz: a 32 MiB bzImage (11 MiB in the Debian fixture) whose
# payload decompresses to the kernel with its built-in initramfs.
KERNEL_IMAGE = 256 * MiB  # the file, read whole
KERNEL_DECOMPRESSED = 256 * MiB  # one decompressed stream
KERNEL_CANDIDATES = 16  # compression magics tried per codec when scanning (a real image: 1-3)
BANNER_CANDIDATES = 64  # "Linux version " strings looked at per decoding (a real kernel: 1-3)
# Every xz and lzma stream read (vmlinuz, NVIDIA's .tar.xz and an xz .run): the kernel's use
# dictionaries of 32 and 64 MiB; xz -9 needs 65 MiB to decompress (xz(1), "Memory usage").
LZMA_MEMORY = 256 * MiB

# Flatcar's releases.json (a few MB in 2026, flatcar-website static/releases-json/) and its
# lts-info (a few lines), read by the reboot gate and the tooling alike; inflated too, if gzip.
FEED = 64 * MiB
FEED_SECONDS = 300.0  # a reboot gate's pass, or a publish run, should not wait hours for it

# /drivers/<module>.conf, the kernel module parameters ConfigMap: a few name=value tokens.
MODULE_PARAMETERS = 64 * KiB


def size(count: int) -> str:
    """A byte count as these bounds are written: 256 MiB, 8 GiB, 1500 bytes."""
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if count >= unit and count % unit == 0:
            return f"{count // unit} {name}"
    return f"{count} bytes"
