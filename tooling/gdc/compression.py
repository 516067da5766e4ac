"""Recompress an image already in a registry from gzip to zstd layers, through the registry API.

:func:`recompress` (``invoke publish`` and the pull benchmark call it) returns the digest of the
image's zstd manifest (or index). The new manifest is PUT under tag, by default under reference
when reference is a tag (a digest reference: under its own digest only). An image with no gzip
layer is left as it is, and its digest returned: a second call does nothing but read.

Per image manifest (Docker schema 2 or OCI; an index: each platform's, then the index):

1. the config blob is downloaded, bounded by its descriptor's size and checked against its
   digest, and its ``rootfs.diff_ids`` read;
2. each gzip layer (:data:`GZIP_TYPES`) is downloaded to a temporary file, bounded and checked
   the same way *before* it is decompressed; decompressed (at most
   :data:`MAX_UNCOMPRESSED_BYTES`) its SHA-256 must be the config's diff_id for that layer;
   then ``zstd -<level> -T0`` (through :mod:`gdc.commands`) makes the new blob, which is
   uploaded unless the registry has it already. Levels 20-22 are capped at an 8 MiB window
   (``--zstd=wlog=23``), which every zstd reader handles; 1-19 never exceed it. Other layers are
   kept as they are (Docker's uncompressed type given its OCI name);
3. the OCI manifest (:data:`OCI_MANIFEST`, config type :data:`OCI_CONFIG`, layer type
   :data:`ZSTD_LAYER`, the same config blob, the annotations kept) is PUT only once every blob
   is in: a failure anywhere writes no manifest. Entries of an index whose platform is
   ``unknown`` (buildx attestations) are kept as they are.

The config is unchanged, so an image's ID and the build inputs its labels record are the same
under either compression. zstd's output for the same input, level and zstd version is the same
bytes, so a layer two images share (a precompiled image's base layers) is one blob; ``cache``
(gzip digest and level -> the zstd descriptor, kept by the caller for a run) saves compressing
it twice. Readers: containerd >= 1.5 (Flatcar ships 1.7.17 and later), CRI-O >= 1.21, Docker
Engine >= 23; dockerd 20.10 cannot pull zstd layers (:func:`check_dockerd`).

Errors are :class:`CompressionError` (a :class:`~nvidia_driver.errors.DriverError`), one line; an
image whose own bytes cannot be recompressed (a layer that is no whole gzip stream or not its
diff_id) is a :class:`DamagedImageError`, which only a new build mends. A layer decompresses to
at most :data:`MAX_UNCOMPRESSED_BYTES` or the free space of the temporary directory, whichever
is less; a full disk is called one. Temporary files live in one directory, removed whatever
happens.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from gdc import commands
from gdc.docker_api import split_reference
from gdc.registry import Registry, Repository, full_disk
from nvidia_driver.errors import DriverError
from nvidia_driver.formats.oci import (
    GZIP_TYPES,
    IMAGE_TYPES,
    INDEX_TYPES,
    MAX_CONFIG_BYTES,
    OCI_CONFIG,
    OCI_INDEX,
    OCI_MANIFEST,
    OCI_NAMES,
    ZSTD_LAYER,
    Manifest,
    checked_digest,
    digest_of,
)

LEVELS = range(1, 23)
DEFAULT_LEVEL = 19
ULTRA_LEVEL = 20  # from here zstd needs --ultra, and would use up to a 128 MiB window
MAX_WINDOW_LOG = 23  # 8 MiB: what level 19 uses at most
MAX_LAYER_BYTES = 32 << 30  # compressed, as a descriptor may say
MAX_UNCOMPRESSED_BYTES = 64 << 30
ZSTD_SECONDS = 3600.0  # one layer's compression
CHUNK_BYTES = 1 << 20
ZSTD_DOCKERD = 23  # the first Docker Engine that pulls zstd layers
_VERSION = re.compile(r"([0-9]+)\.[0-9]+")

Cache = dict[str, dict[str, Any]]


class CompressionError(DriverError):
    """An image that could not be recompressed; the message is one line saying why."""


class DamagedImageError(CompressionError):
    """An image whose layers are not what its config says: recompressing it cannot succeed."""


class Compression(StrEnum):
    ZSTD = "zstd"
    GZIP = "gzip"


def parse_compression(name: str) -> Compression:
    try:
        return Compression(name)
    except ValueError:
        raise CompressionError(f"--compression {name!r} is not known: use zstd (the default; "
                               "containerd >= 1.5, Docker >= 23) or gzip") from None  # fmt: skip


def check_level(level: int) -> int:
    if level not in LEVELS:
        raise CompressionError(f"--zstd-level {level} is out of range: give {LEVELS.start} to "
                               f"{LEVELS.stop - 1} (default {DEFAULT_LEVEL})")  # fmt: skip
    return level


def check_dockerd(version: str) -> None:
    """Refuse a dockerd that cannot pull the zstd images a precompiled build starts from."""
    found = _VERSION.match(version)
    if found and int(found.group(1)) >= ZSTD_DOCKERD:
        return
    raise CompressionError(f"dockerd {version or '(no version)'} cannot pull the zstd layers "
                           "the precompiled images build on: use Docker Engine >= "
                           f"{ZSTD_DOCKERD}, or --compression gzip")  # fmt: skip


def has_gzip_layers(manifest: Manifest) -> bool:
    """Whether an image manifest lists a gzip layer (an index: False, its images may)."""
    if manifest.media_type not in IMAGE_TYPES:
        return False
    layers = manifest.json().get("layers")
    return isinstance(layers, list) and any(
        isinstance(layer, dict) and layer.get("mediaType") in GZIP_TYPES for layer in layers
    )


def recompress(
    registry: Registry,
    name: str,
    reference: str,
    *,
    level: int = DEFAULT_LEVEL,
    tag: str | None = None,
    cache: Cache | None = None,
    runner: Callable[[list[str], float], int] = commands.run_within,
) -> str:
    """Rewrite name:reference with zstd layers; the new manifest's digest (module docstring)."""
    check_level(level)
    if tag is None and not reference.startswith("sha256:"):
        tag = reference
    manifest = registry.manifest(name, reference)  # by digest: checked against it
    with tempfile.TemporaryDirectory(prefix="gdc-zstd.") as scratch:
        work = _Work(registry, name, level, Path(scratch), {} if cache is None else cache, runner)
        new = work.convert(manifest)
        for child in work.children:  # every blob is in: the platforms' manifests, then the top
            _put(registry, name, child.digest, child)
    if new.digest == manifest.digest:
        if tag is not None and tag != reference:
            _put(registry, name, tag, manifest)
        return manifest.digest
    return _put(registry, name, tag or new.digest, new)


def recompress_references(
    references: Iterable[str],
    level: int,
    registry_for: Callable[[str], Registry],
    say: Callable[[str], None],
) -> dict[str, str]:
    """Recompress each pushed ``host/name:tag``; reference -> the zstd manifest's digest."""
    cache: Cache = {}
    clients: dict[str, Registry] = {}
    digests = {}
    for reference in references:
        repository, tag = split_reference(reference)
        parsed = Repository.parse(repository)
        if parsed.host not in clients:  # one client a host: its tokens are reused
            clients[parsed.host] = registry_for(parsed.host)
        client = clients[parsed.host]
        digests[reference] = recompress(client, parsed.name, tag, level=level, cache=cache)
        say(f"zstd layers: {reference}@{digests[reference]}\n")
    return digests


def _put(registry: Registry, name: str, reference: str, manifest: Manifest) -> str:
    digest = registry.put_manifest(name, reference, manifest)
    if digest != manifest.digest:
        raise CompressionError(f"the registry {registry.host} stored the manifest PUT as "
                               f"{name}:{reference} as {digest}, not {manifest.digest}: check "
                               "the registry")  # fmt: skip
    return digest


def _encode(old: dict[str, Any], media_type: str, **parts: object) -> Manifest:
    """The manifest of media_type with parts, keeping old's annotations, subject and type."""
    kept = {key: value for key, value in old.items()
            if key in {"annotations", "subject", "artifactType"}}  # fmt: skip
    document = {"schemaVersion": 2, "mediaType": media_type, **parts, **kept}
    body = json.dumps(document, separators=(",", ":")).encode()
    return Manifest(media_type, body, digest_of(body))


def _size(descriptor: dict[str, Any], bound: int, what: str) -> int:
    size = descriptor.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= bound:
        raise CompressionError(f"{what} {descriptor.get('digest')} has size {size!r}, not 0 to "
                               f"{bound} bytes: refused")  # fmt: skip
    return size


@dataclass
class _Work:
    registry: Registry
    name: str
    level: int
    scratch: Path
    cache: Cache
    runner: Callable[[list[str], float], int]
    children: list[Manifest] = field(default_factory=list)  # to PUT by digest, in order

    def convert(self, manifest: Manifest) -> Manifest:
        if manifest.media_type in INDEX_TYPES:
            return self.index(manifest)
        if manifest.media_type in IMAGE_TYPES:
            return self.image(manifest)
        raise CompressionError(f"{self.name}@{manifest.digest} is a "
                               f"{manifest.media_type or 'untyped'} manifest: only Docker schema "
                               "2 and OCI images and indexes are recompressed")  # fmt: skip

    def index(self, manifest: Manifest) -> Manifest:
        document = manifest.json()
        entries = document.get("manifests")
        if not isinstance(entries, list):
            raise CompressionError(f"the index {self.name}@{manifest.digest} lists no manifests")
        listed, changed = [], False
        for entry in entries:
            platform = entry.get("platform") if isinstance(entry, dict) else None
            if not isinstance(platform, dict) or platform.get("os") == "unknown":
                listed.append(entry)  # an attestation (or no image at all): kept
                continue
            digest = checked_digest(str(entry.get("digest", "")),
                                    f"the index {self.name}@{manifest.digest}")  # fmt: skip
            child = self.registry.manifest(self.name, digest)  # checked against digest
            new = self.convert(child)
            if new.digest != child.digest:
                changed = True
                self.children.append(new)
                entry = {**entry, "mediaType": new.media_type, "digest": new.digest,  # noqa: PLW2901
                         "size": len(new.body)}  # fmt: skip
            listed.append(entry)
        if not changed:
            return manifest
        return _encode(document, OCI_INDEX, manifests=listed)

    def image(self, manifest: Manifest) -> Manifest:
        if not has_gzip_layers(manifest):
            return manifest  # zstd already, or nothing to compress
        document = manifest.json()
        config = document.get("config")
        if not isinstance(config, dict):
            raise CompressionError(f"the manifest {self.name}@{manifest.digest} has no config")
        diff_ids = self.diff_ids(config)
        layers = document["layers"]
        if len(diff_ids) != len(layers):
            raise DamagedImageError(f"the manifest {self.name}@{manifest.digest} lists "
                                   f"{len(layers)} layers, its config {len(diff_ids)} diff_ids: "
                                   "refused")  # fmt: skip
        rewritten = [self.layer(layer, diff_id) if layer.get("mediaType") in GZIP_TYPES
                     else {**layer, "mediaType": OCI_NAMES.get(layer.get("mediaType", ""),
                                                               layer.get("mediaType"))}
                     for layer, diff_id in zip(layers, diff_ids, strict=True)]  # fmt: skip
        return _encode(document, OCI_MANIFEST, config={**config, "mediaType": OCI_CONFIG},
                       layers=rewritten)  # fmt: skip

    def diff_ids(self, descriptor: dict[str, Any]) -> list[str]:
        digest = str(descriptor.get("digest", ""))
        path = self.scratch / "config.json"
        size = _size(descriptor, MAX_CONFIG_BYTES, "the config")
        self.registry.fetch_blob(self.name, digest, size, path)
        try:
            config = json.loads(path.read_bytes())
        except ValueError:
            raise CompressionError(f"the config blob {digest} is not JSON") from None
        finally:
            path.unlink(missing_ok=True)
        diff_ids = (config.get("rootfs") or {}).get("diff_ids") if isinstance(config, dict) \
            else None  # fmt: skip
        if not isinstance(diff_ids, list) or not all(isinstance(d, str) for d in diff_ids):
            raise DamagedImageError(f"the config blob {digest} has no rootfs.diff_ids list")
        return diff_ids

    def layer(self, descriptor: dict[str, Any], diff_id: str) -> dict[str, Any]:
        digest = str(descriptor.get("digest", ""))
        size = _size(descriptor, MAX_LAYER_BYTES, "the layer")
        extra = {key: value for key, value in descriptor.items() if key == "annotations"}
        key = f"{digest} zstd-{self.level}"
        known = self.cache.get(key)
        if known is not None and self.registry.blob_exists(self.name, known["digest"]):
            return {**known, **extra}
        if not commands.available("zstd"):  # before the download
            raise CompressionError("zstd is not on PATH: install it (Debian: apt-get install "
                                   "zstd), or pass --compression gzip")  # fmt: skip
        compressed = self.scratch / "layer.gz"
        tar = self.scratch / "layer.tar"
        zstd = self.scratch / "layer.tar.zst"
        try:
            self.registry.fetch_blob(self.name, digest, size, compressed)  # checked, then read
            _gunzip(compressed, tar, digest, diff_id)
            compressed.unlink()
            self.zstd(tar, zstd, digest)
            tar.unlink()
            new_digest, new_size = _hash_file(zstd)
            if not self.registry.blob_exists(self.name, new_digest):
                self.registry.upload_blob(self.name, zstd, new_digest)
        finally:
            for path in (compressed, tar, zstd):
                path.unlink(missing_ok=True)
        self.cache[key] = {"mediaType": ZSTD_LAYER, "digest": new_digest, "size": new_size}
        return {**self.cache[key], **extra}

    def zstd(self, tar: Path, destination: Path, digest: str) -> None:
        argv = ["zstd", f"-{self.level}", "-T0", "-q", "-f", "--no-progress"]
        if self.level >= ULTRA_LEVEL:  # with level 19's window
            argv += ["--ultra", f"--zstd=wlog={MAX_WINDOW_LOG}"]
        code = self.runner([*argv, "-o", str(destination), str(tar)], ZSTD_SECONDS)
        if code != 0:
            why = f"took over {ZSTD_SECONDS:.0f} s" if code == commands.TIMED_OUT else \
                f"exited {code} (see its output above)"  # fmt: skip
            raise CompressionError(f"zstd -{self.level} of layer {digest} {why}: check the disk "
                                   "space of the temporary directory, or pass --compression "
                                   "gzip")  # fmt: skip


def _gunzip(source: Path, destination: Path, digest: str, diff_id: str) -> None:
    """Decompress source (the verified blob digest) into destination, within the bound (module
    docstring), and check that its SHA-256 is diff_id."""
    free = shutil.disk_usage(destination.parent).free
    bound = min(MAX_UNCOMPRESSED_BYTES, free)
    hasher, count = hashlib.sha256(), 0
    try:
        with gzip.open(source, "rb") as compressed, destination.open("wb") as out:
            while chunk := compressed.read(CHUNK_BYTES):
                count += len(chunk)
                if count > bound:
                    raise _too_large(digest, bound, destination.parent)
                hasher.update(chunk)
                out.write(chunk)
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        full = full_disk(exc, destination)
        if full:
            raise CompressionError(str(full)) from None
        raise DamagedImageError(f"layer {digest} is not a whole gzip stream ({exc}): "
                                "refused") from None  # fmt: skip
    found = "sha256:" + hasher.hexdigest()
    if found != diff_id:
        raise DamagedImageError(f"layer {digest} decompresses to {found}, not the config's "
                                f"diff_id {diff_id}: refused, nothing written")  # fmt: skip


def _too_large(digest: str, bound: int, directory: Path) -> CompressionError:
    if bound == MAX_UNCOMPRESSED_BYTES:
        return CompressionError(f"layer {digest} decompresses to more than "
                                f"{MAX_UNCOMPRESSED_BYTES >> 30} GiB: refused")  # fmt: skip
    return CompressionError(f"layer {digest} decompresses to more than {bound} bytes, the free "
                            f"space of {directory}: free space there, or set TMPDIR to a larger "
                            "disk")  # fmt: skip


def _hash_file(path: Path) -> tuple[str, int]:
    with path.open("rb") as data:
        digest = hashlib.file_digest(data, "sha256").hexdigest()
    return "sha256:" + digest, path.stat().st_size
