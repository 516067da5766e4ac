"""NVIDIA's core objects: a package references them in the driver's sources, not copies them.

A package whose referenced file is missing, or is not the bytes it was built with, is no match:
the node builds its own (test_init.py has that end to end).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from nvidia_driver.errors import DriverError
from nvidia_driver.kbuild.build import _package_files
from nvidia_driver.kbuild.packages import (
    LinkedModule,
    Package,
    PackageMetadata,
    load_package,
    matching_package,
    no_match_reason,
    sha256_file,
    write_package,
)

DRIVER = "580.105.08"
KERNEL = "6.12.81-flatcar"
BANNER = f"Linux version {KERNEL} (gcc 14.3.1) #1 SMP PREEMPT_DYNAMIC"
CORE = "kernel/nvidia/nv-kernel.o_binary"


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    """/usr/src/nvidia-<version> with the proprietary core object."""
    sources = tmp_path / "usr" / "src" / f"nvidia-{DRIVER}"
    (sources / CORE).parent.mkdir(parents=True)
    (sources / CORE).write_bytes(b"core\n")
    return sources


def _metadata(**changes: object) -> PackageMetadata:
    fields: dict[str, object] = {
        "banner": BANNER,
        "kernel_release": KERNEL,
        "driver_version": DRIVER,
        "module_type": "proprietary",
        "compiler": "gcc-14",
        "source_digest": "sha256:0",
        "modules": [],
        "linked": [LinkedModule("nvidia.ko", ["nvidia.interface.o", "nvidia.core.o_binary"])],
        "referenced": {"nvidia.core.o_binary": CORE},
    }
    return PackageMetadata(**{**fields, **changes})  # type: ignore[arg-type]


def _write(tmp_path: Path, sources: Path) -> Package:
    interface = tmp_path / "nv-interface.o"
    interface.write_bytes(b"interface\n")
    destination = tmp_path / "precompiled" / "proprietary" / "nvidia-modules-6.12.81"
    return write_package(destination, _metadata(), {"nvidia.interface.o": interface}, sources)


def _match(tmp_path: Path, sources: Path) -> Package | None:
    return matching_package([tmp_path / "precompiled"], BANNER, DRIVER, "proprietary", sources)


def test_a_package_references_the_core_object_and_uses_it_when_it_matches(
    tmp_path: Path, sources: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    package = _write(tmp_path, sources)
    assert sorted(path.name for path in package.path.iterdir()) == [
        "metadata.json",
        "nvidia.interface.o",
    ]
    recorded = json.loads((package.path / "metadata.json").read_text())
    assert recorded["referenced"] == {"nvidia.core.o_binary": CORE}
    assert recorded["files"]["nvidia.core.o_binary"] == sha256_file(sources / CORE)

    found = _match(tmp_path, sources)

    assert found == package
    assert found.file("nvidia.core.o_binary") == sources / CORE
    assert found.file("nvidia.interface.o") == package.path / "nvidia.interface.o"
    assert found.damaged_file() is None
    found.verify()
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda core: core.unlink(), "is missing"),
        (lambda core: core.write_bytes(b"another driver's core\n"),
         "does not match the SHA-256 the package recorded"),
    ],
    ids=["missing", "other-digest"],
)  # fmt: skip
def test_a_package_whose_core_object_is_missing_or_differs_is_refused_with_the_reason(
    tmp_path: Path,
    sources: Path,
    capsys: pytest.CaptureFixture[str],
    change: Callable[[Path], object],
    reason: str,
) -> None:
    package = _write(tmp_path, sources)
    change(sources / CORE)

    assert _match(tmp_path, sources) is None

    assert capsys.readouterr().out == (
        f"WARNING: package {package.path} does not fit this image's driver sources: "
        f"{sources / CORE} {reason}\n"
    )
    assert package.unmatched_reference() == f"{sources / CORE} {reason}"
    assert package.damaged_file() == "nvidia.core.o_binary"
    with pytest.raises(DriverError, match=r"nvidia\.core\.o_binary is missing or does not match"):
        package.verify()


def test_a_format_1_package_that_holds_its_core_object_is_still_read(
    tmp_path: Path, sources: Path
) -> None:
    path = tmp_path / "precompiled" / "proprietary" / "nvidia-modules-6.12.81"
    path.mkdir(parents=True)
    files = {"nvidia.interface.o": b"interface\n", "nvidia.core.o_binary": b"old core\n"}
    for name, content in files.items():
        (path / name).write_bytes(content)
    metadata = json.loads(_metadata(files={}, referenced={}).to_json())
    del metadata["referenced"]  # format 1 had no such field
    metadata.update(format=1, files={name: sha256_file(path / name) for name in files})
    (path / "metadata.json").write_text(json.dumps(metadata))

    found = _match(tmp_path, sources)

    assert found is not None
    assert found.file("nvidia.core.o_binary") == path / "nvidia.core.o_binary"
    assert found.damaged_file() is None


def test_a_package_of_an_unknown_format_is_not_read(tmp_path: Path, sources: Path) -> None:
    package = _write(tmp_path, sources)
    metadata = json.loads((package.path / "metadata.json").read_text())
    (package.path / "metadata.json").write_text(json.dumps({**metadata, "format": 3}))
    assert load_package(package.path, sources) is None


@pytest.mark.parametrize(
    "shape",
    [
        lambda metadata: [metadata],
        lambda metadata: {**metadata, "files": list(metadata["files"])},
        lambda metadata: {**metadata, "referenced": [CORE]},
        lambda metadata: {**metadata, "modules": [1]},
        lambda metadata: {**metadata, "linked": [{"module": "nvidia.ko", "objects": "a.o"}]},
    ],
    ids=["a-list", "files-a-list", "referenced-a-list", "a-module-a-number", "objects-a-string"],
)
def test_metadata_of_the_wrong_shape_is_an_unreadable_package(
    tmp_path: Path, sources: Path, shape: Callable[[dict[str, object]], object]
) -> None:
    """Valid JSON, but not a package's metadata (a file changed on the node's disk): no package,
    as unreadable JSON is, where it was an AttributeError traceback from init and status."""
    package = _write(tmp_path, sources)
    metadata = json.loads((package.path / "metadata.json").read_text())
    (package.path / "metadata.json").write_text(json.dumps(shape(metadata)))
    assert load_package(package.path, sources) is None
    assert _match(tmp_path, sources) is None
    assert no_match_reason([tmp_path / "precompiled"], BANNER, DRIVER, "proprietary", sources) == (
        f"the image's packages cannot be read: {package.path / 'metadata.json'} is not a "
        "package's metadata"
    )


def _built_tree(workdir: Path, core: bytes) -> None:
    """What make leaves in a copy of kernel/: the module, its interface and the core."""
    for name, content in {
        "nvidia.ko": b"linked\n",
        "nvidia/nv-interface.o": b"interface\n",
        "nvidia/nv-kernel.o_binary": core,
        "nvidia.mod.o": b"mod\n",
        "module.lds": b"SECTIONS {}\n",
    }.items():
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_bytes(content)


@pytest.mark.parametrize(("core", "referenced"), [(b"core\n", True), (b"patched\n", False)])
def test_the_build_references_the_core_object_only_if_it_linked_the_sources_one(
    tmp_path: Path, sources: Path, core: bytes, referenced: bool
) -> None:
    workdir = tmp_path / "build"
    _built_tree(workdir, core)

    packaged = _package_files(workdir, "proprietary", sources / "kernel")

    [linked] = packaged.linked
    assert linked.objects == ["nvidia.interface.o", "nvidia.core.o_binary", "nvidia.mod.o"]
    if referenced:
        assert packaged.referenced == {"nvidia.core.o_binary": CORE}
        assert "nvidia.core.o_binary" not in packaged.files
    else:
        assert packaged.referenced == {}
        assert packaged.files["nvidia.core.o_binary"] == workdir / "nvidia/nv-kernel.o_binary"
