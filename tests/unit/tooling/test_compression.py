"""gdc.compression against a loopback registry: gzip layers become zstd ones, verified first."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from oci_registry import INDEX, OCIRegistry, digest_of, tar_layer

from gdc import compression
from gdc.compression import (
    CompressionError,
    check_dockerd,
    check_level,
    parse_compression,
    recompress,
    recompress_references,
)
from gdc.registry import Registry
from nvidia_driver.errors import DriverError
from nvidia_driver.formats.oci import OCI_CONFIG, OCI_INDEX, OCI_MANIFEST, ZSTD_LAYER

NAME = "gdc/driver"
BASE = tar_layer({"etc/os-release": b"ID=debian\n", "usr/bin/tool": b"\x7fELF" + b"x" * 5000})
TOP = tar_layer({"opt/gdc/hello.txt": b"hello from the image\n"})


@pytest.fixture
def registry() -> Iterator[OCIRegistry]:
    with OCIRegistry() as server:
        yield server


def _unzstd(blob: bytes) -> bytes:
    return subprocess.run(["zstd", "-d", "-c", "-q"], input=blob, capture_output=True,
                          check=True).stdout  # fmt: skip


def _manifest(registry: OCIRegistry, reference: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(registry.manifests[NAME][reference].body)
    return document


def _writes(registry: OCIRegistry) -> list[tuple[str, str]]:
    return [(method, path) for method, path, _ in registry.log if method in {"PUT", "POST"}]


def test_a_gzip_image_becomes_zstd_with_the_same_diff_ids(registry: OCIRegistry) -> None:
    old = registry.add_layered_image(NAME, ["t"], [BASE, TOP], labels={"a": "b"})
    config_digest = _manifest(registry, "t")["config"]["digest"]
    digest = recompress(Registry(registry.host), NAME, "t")
    assert digest != old
    assert registry.tags(NAME)["t"] == digest
    assert registry.manifests[NAME]["t"].media_type == OCI_MANIFEST
    manifest = _manifest(registry, "t")
    assert manifest["mediaType"] == OCI_MANIFEST
    assert manifest["config"] == {"mediaType": OCI_CONFIG, "digest": config_digest,
                                  "size": len(registry.blobs[config_digest])}  # fmt: skip
    assert [layer["mediaType"] for layer in manifest["layers"]] == [ZSTD_LAYER] * 2
    diff_ids = json.loads(registry.blobs[config_digest])["rootfs"]["diff_ids"]
    tars = [_unzstd(registry.blobs[layer["digest"]]) for layer in manifest["layers"]]
    assert [digest_of(tar) for tar in tars] == diff_ids == [digest_of(BASE), digest_of(TOP)]
    for layer in manifest["layers"]:
        assert layer["size"] == len(registry.blobs[layer["digest"]])
    with tarfile.open(fileobj=io.BytesIO(tars[1])) as tar:
        extracted = tar.extractfile("opt/gdc/hello.txt")
        assert extracted is not None
        assert extracted.read() == b"hello from the image\n"
    # The blobs went up before the manifest, which is the last write.
    assert _writes(registry)[-1] == ("PUT", f"/v2/{NAME}/manifests/t")
    assert [m for m, _ in _writes(registry)].count("POST") == 2


def test_recompressing_twice_writes_nothing_the_second_time(registry: OCIRegistry) -> None:
    registry.add_layered_image(NAME, ["t"], [BASE])
    client = Registry(registry.host)
    first = recompress(client, NAME, "t")
    registry.log.clear()
    assert recompress(client, NAME, "t") == first
    assert _writes(registry) == []


def test_an_image_pushed_with_zstd_or_uncompressed_layers_is_left_alone(
    registry: OCIRegistry,
) -> None:
    registry.add_layered_image(NAME, ["plain"], [BASE], media_type="application/vnd.oci."
                               "image.layer.v1.tar", docker=False)  # fmt: skip
    digest = registry.tags(NAME)["plain"]
    assert recompress(Registry(registry.host), NAME, "plain") == digest
    assert _writes(registry) == []


def test_a_tampered_blob_is_refused_before_it_is_decompressed(
    registry: OCIRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = registry.add_layered_image(NAME, ["t"], [BASE, TOP])
    layer = _manifest(registry, "t")["layers"][1]["digest"]
    registry.blobs[layer] = gzip.compress(tar_layer({"opt/evil": b"x"}))
    opened: list[Path] = []
    gunzip = compression._gunzip  # spied on: which blobs were decompressed

    def spy(source: Path, destination: Path, digest: str, diff_id: str) -> None:
        opened.append(source)
        gunzip(source, destination, digest, diff_id)

    monkeypatch.setattr(compression, "_gunzip", spy)
    with pytest.raises(DriverError) as error:
        recompress(Registry(registry.host), NAME, "t")
    message = str(error.value)
    assert "\n" not in message
    assert f"for blob {layer} of {NAME}" in message
    assert "refused, nothing read from it" in message
    assert len(opened) == 1  # the first layer only: the tampered one was never opened
    assert not any(path.endswith("/manifests/t") for _, path in _writes(registry))
    assert registry.tags(NAME)["t"] == old


def test_a_blob_longer_than_its_descriptor_is_cut_off_and_refused(registry: OCIRegistry) -> None:
    registry.add_layered_image(NAME, ["t"], [BASE])
    layer = _manifest(registry, "t")["layers"][0]["digest"]
    registry.blobs[layer] += b"\0" * (4 << 20)
    with pytest.raises(DriverError, match=r"sent more than \d+ bytes for blob"):
        recompress(Registry(registry.host), NAME, "t")


def test_a_diff_id_mismatch_is_refused_and_no_manifest_written(registry: OCIRegistry) -> None:
    wrong = "sha256:" + "9" * 64
    old = registry.add_layered_image(NAME, ["t"], [BASE, TOP],
                                     diff_ids=[digest_of(BASE), wrong])  # fmt: skip
    with pytest.raises(CompressionError) as error:
        recompress(Registry(registry.host), NAME, "t")
    assert str(error.value) == (
        f"layer {_manifest(registry, 't')['layers'][1]['digest']} decompresses to "
        f"{digest_of(TOP)}, not the config's diff_id {wrong}: refused, nothing written"
    )
    assert not any("/manifests/" in path for _, path in _writes(registry))
    assert registry.tags(NAME) == {"t": old}


def test_an_index_is_rewritten_platform_by_platform(registry: OCIRegistry) -> None:
    children = []
    for arch in ("amd64", "arm64"):
        digest = registry.add_layered_image(NAME, [], [BASE, tar_layer({"arch": arch.encode()})],
                                            arch=arch)  # fmt: skip
        body = registry.manifests[NAME][digest].body
        children.append({"mediaType": registry.manifests[NAME][digest].media_type,
                         "digest": digest, "size": len(body),
                         "platform": {"os": "linux", "architecture": arch}})  # fmt: skip
    attestation = {"mediaType": OCI_MANIFEST, "digest": "sha256:" + "0" * 64, "size": 1,
                   "platform": {"os": "unknown", "architecture": "unknown"}}  # fmt: skip
    index = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "annotations": {"k": "v"},
                        "manifests": [*children, attestation]}).encode()  # fmt: skip
    registry.put(NAME, ["multi"], INDEX, index)
    digest = recompress(Registry(registry.host), NAME, "multi")
    assert registry.tags(NAME)["multi"] == digest
    rewritten = _manifest(registry, "multi")
    assert rewritten["mediaType"] == OCI_INDEX
    assert rewritten["annotations"] == {"k": "v"}
    assert rewritten["manifests"][2] == attestation
    for entry, old in zip(rewritten["manifests"][:2], children, strict=True):
        assert entry["platform"] == old["platform"]
        assert entry["mediaType"] == OCI_MANIFEST
        child = registry.manifests[NAME][entry["digest"]]
        assert entry["size"] == len(child.body)
        layers = json.loads(child.body)["layers"]
        assert [layer["mediaType"] for layer in layers] == [ZSTD_LAYER] * 2
    # The base layer both platforms share is one zstd blob, compressed once.
    assert rewritten["manifests"][0] != rewritten["manifests"][1]
    first, second = (json.loads(registry.manifests[NAME][e["digest"]].body)["layers"][0]
                     for e in rewritten["manifests"][:2])  # fmt: skip
    assert first == second
    assert [m for m, _ in _writes(registry)].count("POST") == 3


def test_a_cache_shared_across_images_skips_the_layers_done_already(
    registry: OCIRegistry,
) -> None:
    registry.add_layered_image(NAME, ["build"], [BASE])
    registry.add_layered_image(NAME, ["precompiled"], [BASE, TOP])
    client, cache = Registry(registry.host), {}
    recompress(client, NAME, "build", cache=cache)
    registry.log.clear()
    recompress(client, NAME, "precompiled", cache=cache)
    base_gzip = _manifest(registry, "build")["layers"][0]
    fetched = [path for method, path, _ in registry.log if method == "GET" and "/blobs/" in path]
    assert len(fetched) == 2  # the config and the top layer: the base layer is known
    assert _manifest(registry, "precompiled")["layers"][0] == base_gzip


def test_an_explicit_tag_receives_the_new_manifest(registry: OCIRegistry) -> None:
    old = registry.add_layered_image(NAME, ["gzip"], [TOP])
    digest = recompress(Registry(registry.host), NAME, old, tag="zstd", level=3)
    assert registry.tags(NAME) == {"gzip": old, "zstd": digest}


@pytest.mark.parametrize("level", [0, 23, -1])
def test_a_level_out_of_range_fails_before_any_request(registry: OCIRegistry,
                                                       level: int) -> None:  # fmt: skip
    with pytest.raises(CompressionError, match=rf"--zstd-level {level} is out of range: give 1 "
                       "to 22"):  # fmt: skip
        recompress(Registry(registry.host), NAME, "t", level=level)
    assert registry.log == []


def test_an_ultra_level_keeps_an_8_mib_window(registry: OCIRegistry) -> None:
    registry.add_layered_image(NAME, ["t"], [TOP])
    seen: list[list[str]] = []

    def runner(argv: list[str], seconds: float) -> int:
        seen.append(argv)
        return compression.commands.run_within(argv, seconds)

    recompress(Registry(registry.host), NAME, "t", level=22, runner=runner)
    assert seen[0][:7] == ["zstd", "-22", "-T0", "-q", "-f", "--no-progress", "--ultra"]
    assert "--zstd=wlog=23" in seen[0]
    assert check_level(19) == 19


def test_a_failing_zstd_fails_the_image_in_one_line(registry: OCIRegistry) -> None:
    old = registry.add_layered_image(NAME, ["t"], [TOP])
    with pytest.raises(CompressionError) as error:
        recompress(Registry(registry.host), NAME, "t", runner=lambda _argv, _seconds: 124)
    assert "took over 3600 s" in str(error.value)
    assert "--compression gzip" in str(error.value)
    assert registry.tags(NAME) == {"t": old}


def test_compression_names_and_dockerd_versions() -> None:
    assert parse_compression("gzip") is compression.Compression.GZIP
    with pytest.raises(CompressionError, match="--compression 'lz4' is not known: use zstd"):
        parse_compression("lz4")
    for version in ("23.0.0", "24.0.7", "27.3.1", "26.1.5+dfsg1"):
        check_dockerd(version)
    with pytest.raises(CompressionError) as error:
        check_dockerd("20.10.24+dfsg1")
    assert str(error.value) == (
        "dockerd 20.10.24+dfsg1 cannot pull the zstd layers the precompiled images build on: "
        "use Docker Engine >= 23, or --compression gzip"
    )


def test_pushed_references_are_recompressed_each_in_its_registry(registry: OCIRegistry) -> None:
    registry.add_layered_image(NAME, ["a", "b"], [BASE])
    said: list[str] = []
    references = [f"{registry.host}/{NAME}:a", f"{registry.host}/{NAME}:b"]
    digests = recompress_references(references, 19, Registry, said.append)
    assert set(digests.values()) == {registry.tags(NAME)["a"]} == {registry.tags(NAME)["b"]}
    assert said == [f"zstd layers: {reference}@{digests[reference]}\n" for reference in references]
    assert [m for m, _ in _writes(registry)].count("POST") == 1  # the layer, once


def test_a_full_disk_is_called_a_full_disk(registry: OCIRegistry, tmp_path: Path) -> None:
    layer = gzip.compress(TOP)
    source = tmp_path / "layer.gz"
    source.write_bytes(layer)
    with pytest.raises(CompressionError, match=r"no space left on the disk of /dev/full \(") as err:
        compression._gunzip(source, Path("/dev/full"), digest_of(layer), digest_of(TOP))
    assert "gzip stream" not in str(err.value)


def test_the_decompression_bound_is_the_free_disk_space(
    registry: OCIRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry.add_layered_image(NAME, ["t"], [BASE])

    def nearly_full(path: Any) -> Any:
        return type("Usage", (), {"free": 1000, "total": 1 << 40, "used": 0})()

    monkeypatch.setattr(compression.shutil, "disk_usage", nearly_full)
    with pytest.raises(CompressionError, match=r"decompresses to more than 1000 bytes, the free "
                       "space of"):  # fmt: skip
        recompress(Registry(registry.host), NAME, "t")
