"""``invoke build`` and ``invoke push`` end to end: real dockerd, real registry, loopback sources.

NVIDIA's and Flatcar's sites are stood in for on 127.0.0.1 (see fixtures/images.py). The images
are built once per session by the ``build_image`` and ``precompiled_image`` fixtures
(conftest.py), which test_operator_daemonset.py, test_qemu_harness.py and test_publish.py share.

The precompiled image's build is also the project's ``nvidia-driver build --flatcar-version``
for a gcc-14 release (Flatcar 4230.1.0 to 4593) end to end: the release's container tarball
streamed and verified, the build image's own gcc-14, the pci_resize_resource patch for a kernel
past 6.12.97. Its open nvidia.ko is insmod-ed into that kernel under QEMU (the session's boot,
conftest.py): it must reach "NVRM: No NVIDIA GPU found".
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest
from fixtures.docker_env import Registry, docker_env, remove_images
from fixtures.images import DRIVER, FLATCAR, KERNEL_TAG, PREFIX, Invoke
from fixtures.qemu import BROKEN_BUILD, NO_GPU, BootResult
from fixtures.release_server import TEST_RELEASE

from nvidia_driver.kbuild.packages import Package, load_package

pytestmark = pytest.mark.integration

PATCH = "pci-resize-resource-exclude-bars"

MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json, "
    "application/vnd.oci.image.manifest.v1+json"
)


def _docker(*args: str) -> str:
    result = subprocess.run(["docker", *args], env=docker_env(), capture_output=True, text=True,
                            timeout=600, check=True)  # fmt: skip
    return result.stdout


def _in_image(reference: str, script: str) -> str:
    """Run script in a throwaway container (no network, entrypoint bypassed)."""
    return _docker(
        "run", "--rm", "--network", "none", "--entrypoint", "sh", reference, "-c", script
    )


def _layers(reference: str) -> list[str]:
    return list(json.loads(_docker("image", "inspect", "--format", "{{json .RootFS.Layers}}",
                                   reference)))  # fmt: skip


def test_the_build_image_carries_driver_fabric_manager_and_entrypoint(
    invoke: Invoke, build_image: subprocess.CompletedProcess[str]
) -> None:
    reference = invoke.reference(f"{DRIVER}-flatcar")
    assert reference in build_image.stdout
    assert invoke.reference(f"{DRIVER}-flatcar-flatcar{FLATCAR}") in build_image.stdout
    config = json.loads(_docker("image", "inspect", "--format", "{{json .Config}}", reference))
    assert config["Entrypoint"] == ["nvidia-driver", "init"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in config["Env"]
    assert f"DRIVER_VERSION={DRIVER}" in config["Env"]
    assert "DRIVER_BRANCH=535" in config["Env"]
    assert "TARGETARCH=amd64" in config["Env"]
    assert config["Labels"]["org.opencontainers.image.version"] == DRIVER
    assert config["Labels"]["gpu-driver-container.flatcar-version"] == FLATCAR
    listing = _in_image(reference, (
        "nvidia-driver --help >/dev/null && echo entrypoint-ok; "
        "for t in nvidia-smi nv-fabricmanager nvidia-fabricmanager-start.sh gcc-13 gcc-14 gcc-15 "
        "pahole; "
        "do command -v $t; done; "
        "ls /usr/share/nvidia/nvswitch/ /usr/src/nvidia-" + DRIVER + "/; "
        "ls /usr/share/doc/gpu-driver-container/; "
        "ls /var/lib/apt/lists | wc -l; ls /tmp | wc -l"
    ))  # fmt: skip
    assert "entrypoint-ok" in listing
    for path in ("/usr/bin/nvidia-smi", "/usr/bin/nv-fabricmanager", "fabricmanager.cfg",
                 "dgxh100_hgxh100_topology", "kernel-open", "/usr/bin/gcc-13", "/usr/bin/gcc-14",
                 "/usr/bin/gcc-15", "/usr/bin/pahole", "LICENSE", "NOTICE"):  # fmt: skip
        assert path in listing, listing
    assert listing.split()[-2:] == ["0", "0"]  # no apt lists, no .run left behind


# What the build image must not carry (images/build/Dockerfile): Mesa and LLVM, which only
# libglx0's and libegl1's dependencies would bring (gdc-no-mesa stands in for them), systemd,
# which libibverbs1's would (systemd-standalone-sysusers stands in), and Perl's standard library,
# which infiniband-diags' would (gdc-no-perl stands in; perl-base stays, as it is essential).
UNWANTED_PREFIXES = ("libllvm", "mesa-", "perl-modules-", "libperl")
UNWANTED_PACKAGES = ("libgl1-mesa-dri", "libglx-mesa0", "libegl-mesa0", "libgbm1", "systemd",
                     "perl")  # fmt: skip
# Every Perl script left in the image (update-rc.d's shebang is `#! /usr/bin/perl`) compiles
# (its `use`s resolve) with perl-base alone, and infiniband-diags' compiled tools resolve every
# library they link.
PERL_SCRIPTS_COMPILE = (
    "for f in $(grep -l '^#! */usr/bin/perl' /usr/bin/* /usr/sbin/* /usr/lib/*/* 2>/dev/null); do "
    'perl -c $f 2>&1 || echo "perl-fails $f"; done; '
    "for t in ibstat sminfo perfquery; do ldd /usr/sbin/$t | grep 'not found'; done; "
    "ls /usr/sbin/ibstat /usr/sbin/ibstatus; true"
)
# The files dpkg's gdc-slim rules keep under /usr/share/doc are licences; NVIDIA's redist
# archives put theirs under /usr/share/doc/<component>/ (sources/redist.py).
LICENCE_NAMES = ("copyright", "LICENSE", "third-party-notices.txt")
OUR_DOCS = "/usr/share/doc/gpu-driver-container/"
FIND_DOCS = (
    "find /usr/share/doc /usr/share/man /usr/share/info /usr/share/locale -type f 2>/dev/null; "
    "find /usr/share/man /usr/share/info /usr/share/locale ! -type d 2>/dev/null; true"
)
# Each gcc's include directory (kbuild: -isystem $(CC -print-file-name=include)), libgcc.a and
# cc1, then libasan.a and lto1, which gcc prints back as given when it has none.
COMPILER_FILES = (
    "for f in include/stddef.h libgcc.a; do gcc-$0 -print-file-name=$f; done; "
    "gcc-$0 -print-prog-name=cc1; gcc-$0 -print-file-name=libasan.a; gcc-$0 -print-prog-name=lto1"
)


def test_the_build_image_has_no_mesa_llvm_systemd_perl_or_documentation(
    invoke: Invoke, build_image: subprocess.CompletedProcess[str]
) -> None:
    reference = invoke.build_reference
    listing = _in_image(reference, "dpkg-query -W -f '${Status} ${Package}\\n'")
    installed = [line.rsplit(" ", 1)[1] for line in listing.splitlines()
                 if line.startswith("install ok installed ")]  # fmt: skip
    for name in ("gdc-no-mesa", "gdc-no-perl", "libgl1", "libegl1", "systemd-standalone-sysusers",
                 "infiniband-diags", "perl-base"):  # fmt: skip
        assert name in installed, name
    unwanted = [name for name in installed
                if name.startswith(UNWANTED_PREFIXES) or name in UNWANTED_PACKAGES]  # fmt: skip
    assert not unwanted, unwanted
    perl = _in_image(reference, PERL_SCRIPTS_COMPILE)
    for absent in ("perl-fails", "not found"):
        assert absent not in perl, perl
    for present in ("/usr/sbin/ibstat", "/usr/sbin/ibstatus"):
        assert present in perl, perl
    # dpkg keeps the directories and symlinks below an include pattern's fixed part
    # (/usr/share/doc/), so /usr/share/doc/cpp-14 -> gcc-14-base stays: regular files count.
    files = _in_image(reference, FIND_DOCS).splitlines()
    others = [path for path in files if not path.startswith(OUR_DOCS)
              and Path(path).name not in LICENCE_NAMES]  # fmt: skip
    assert not others, others
    assert f"{OUR_DOCS}LICENSE" in files
    assert any(path.endswith("/copyright") for path in files)


def test_the_compilers_keep_their_headers_and_libgcc_but_no_sanitizers_or_lto(
    invoke: Invoke, build_image: subprocess.CompletedProcess[str]
) -> None:
    for major in (13, 14, 15):
        printed = _in_image(invoke.build_reference, f"sh -c '{COMPILER_FILES}' {major}").split()
        directory = f"/usr/lib/gcc/x86_64-linux-gnu/{major}"
        assert printed == [f"{directory}/include/stddef.h", f"{directory}/libgcc.a",
                           f"/usr/libexec/gcc/x86_64-linux-gnu/{major}/cc1", "libasan.a",
                           "lto1"]  # fmt: skip


def test_the_precompiled_image_is_one_layer_on_the_build_image(
    invoke: Invoke, precompiled_image: subprocess.CompletedProcess[str]
) -> None:
    build = invoke.reference(f"{DRIVER}-flatcar")
    precompiled = invoke.reference(f"{DRIVER}-flatcar{FLATCAR}")
    by_kernel = invoke.reference(f"535-{KERNEL_TAG}-flatcar{FLATCAR}")
    assert by_kernel in precompiled_image.stdout
    assert "and adds 1 (" in precompiled_image.stdout
    assert _layers(precompiled)[:-1] == _layers(build)
    assert len(_layers(precompiled)) == len(_layers(build)) + 1
    packages = _in_image(by_kernel, "ls -d /opt/nvidia/precompiled/*/*/")
    assert "/opt/nvidia/precompiled/open/" in packages
    assert "/opt/nvidia/precompiled/proprietary/" in packages
    metadata = _in_image(by_kernel, "cat /opt/nvidia/precompiled/open/*/metadata.json")
    assert json.loads(metadata)["kernel_release"] == TEST_RELEASE.kernel.release
    assert json.loads(metadata)["flatcar_version"] == FLATCAR


# apt's lists, downloads and package caches (pkgcache.bin, srcpkgcache.bin): anything but a
# directory. Directories may stay: Debian's base layer ships /var/cache/apt/archives and
# /var/lib/apt/lists empty, and removing one in a layer above would add a whiteout, not save a
# byte. The one RUN that calls apt removes the rest in the same step, so no layer holds them.
APT_LEFTOVERS = "find /var/cache/apt /var/lib/apt/lists ! -type d"


def test_neither_image_carries_apt_s_caches(
    invoke: Invoke,
    build_image: subprocess.CompletedProcess[str],
    precompiled_image: subprocess.CompletedProcess[str],
) -> None:
    for reference in (invoke.build_reference, invoke.precompiled_reference):
        assert _in_image(reference, APT_LEFTOVERS) == "", reference


def _comment(module: Path) -> str:
    """The .comment section: the compiler versions that made the object."""
    return subprocess.run(["readelf", "-p", ".comment", str(module)], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip


def test_the_image_build_compiled_with_its_own_gcc14_and_the_patch(
    invoke: Invoke, precompiled_packages: Path
) -> None:
    """Both packages were compiled by the build image's own gcc-14 (forky's, not the developer
    container's trixie gcc-14: no ~480 MB download and GBs unpacked for a gcc-14 kernel), with
    the pci_resize_resource patch on the open ones. (The packages are checked, not the build's
    log: a Docker cache hit replays no log.)"""
    [image_gcc] = _in_image(invoke.build_reference, "gcc-14 --version | head -n 1").splitlines()
    for module_type in ("open", "proprietary"):
        [metadata] = (precompiled_packages / module_type).glob("*/metadata.json")
        package = load_package(metadata.parent)
        assert package is not None
        assert package.metadata.compiler == image_gcc, package.metadata
        # The patch is for kernel-open only: kernel/ has no call to pci_resize_resource
        # (patches/index.json).
        assert package.metadata.patches == ([PATCH] if module_type == "open" else [])
        assert package.metadata.kernel_release == TEST_RELEASE.kernel.release
        assert package.metadata.flatcar_version == FLATCAR


# NVIDIA's core objects, by their name in a proprietary package and their path in the sources.
CORE_OBJECTS = {
    "nvidia.core.o_binary": "kernel/nvidia/nv-kernel.o_binary",
    "nvidia-modeset.core.o_binary": "kernel/nvidia-modeset/nv-modeset-kernel.o_binary",
}


def test_the_precompiled_layer_references_the_core_objects_the_build_image_holds(
    invoke: Invoke, precompiled_packages: Path
) -> None:
    """The proprietary package holds no core object (64 MB) of its own: it references the build
    image's, by path and SHA-256, so the precompiled image's layer repeats none of its bytes."""
    assert not list(precompiled_packages.rglob("*.o_binary"))
    [metadata] = (precompiled_packages / "proprietary").glob("*/metadata.json")
    package = load_package(metadata.parent)
    assert package is not None
    assert package.metadata.referenced == CORE_OBJECTS
    paths = " ".join(CORE_OBJECTS.values())
    digests = _in_image(invoke.build_reference, f"cd /usr/src/nvidia-{DRIVER} && sha256sum {paths}")
    for name, line in zip(CORE_OBJECTS, digests.splitlines(), strict=True):
        assert line.split()[0] == package.metadata.files[name], line


def test_the_image_built_open_modules_load_into_the_release_kernel(
    precompiled_open_package: Package, release_kernel_boot: BootResult
) -> None:
    boot = release_kernel_boot
    nvidia = precompiled_open_package.path / "nvidia.ko"
    assert "GCC: (Debian 14." in _comment(nvidia)
    load = boot.load(nvidia)
    assert NO_GPU in load.kernel_log, boot.console
    assert load.errno_name == "ENODEV"
    assert not any(error in boot.console for error in BROKEN_BUILD)
    # The package's banner is exactly the /proc/version of the kernel that booted, and no other.
    banner = precompiled_open_package.metadata.banner
    assert banner == boot.proc_version
    assert precompiled_open_package.matches(boot.proc_version)
    assert not precompiled_open_package.matches(boot.proc_version.replace(" SMP ", " SMP  "))


def test_push_then_pull_back_from_the_registry(
    invoke: Invoke, precompiled_image: subprocess.CompletedProcess[str]
) -> None:
    # gzip: the suite's dockerd is Debian 12's 20.10, which cannot pull zstd layers (push's
    # default; docs/images.md, "Layer compression"). test_zstd_layers.py covers zstd.
    pushed = invoke.run("push", "precompiled", "--compression", "gzip")
    tags = {
        "build": f"{DRIVER}-flatcar",
        "alias": f"{DRIVER}-flatcar-flatcar{FLATCAR}",
        "precompiled": f"{DRIVER}-flatcar{FLATCAR}",
        "by_kernel": f"535-{KERNEL_TAG}-flatcar{FLATCAR}",
    }
    references = {name: invoke.reference(tag) for name, tag in tags.items()}
    for reference in references.values():
        assert f"pushed {reference}@sha256:" in pushed.stdout
    remove_images(*references.values())
    for reference in references.values():
        _docker("pull", reference)
    assert _layers(references["alias"]) == _layers(references["build"])
    assert _layers(references["by_kernel"]) == _layers(references["precompiled"])
    assert _layers(references["precompiled"])[:-1] == _layers(references["build"])
    # The registry stores the shared layers once: the precompiled manifest lists the build
    # image's blobs and one more.
    build_blobs = _manifest_layers(invoke.registry, tags["build"])
    precompiled_blobs = _manifest_layers(invoke.registry, tags["precompiled"])
    assert precompiled_blobs[:-1] == build_blobs
    assert len(precompiled_blobs) == len(build_blobs) + 1


def _manifest_layers(registry: Registry, tag: str) -> list[str]:
    request = urllib.request.Request(  # noqa: S310 - the loopback registry
        f"{registry.url}/v2/gdc/driver/manifests/{PREFIX}-{tag}",
        headers={"Accept": MANIFEST_TYPES},
    )
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
        manifest = json.load(response)
    return [layer["digest"] for layer in manifest["layers"]]
