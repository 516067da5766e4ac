"""The cluster session's real peers, built from their own Go modules as peers.toml pins them.

Each peer is a small Go module of ours, ``peers/<name>/go.mod``: it requires the peer's module at
its pinned version and names the packages to build as ``tool`` lines; its ``go.sum`` holds the
hash of every module the build reads. ``lock`` makes both from peers.toml (it needs the Go module
proxy); ``build`` builds with ``-mod=readonly -trimpath`` (so a module whose hash differs fails the
build) into ``$GDC_CACHE/peers/<name>-<version>-<key>/``. The key covers the lock, the packages
and the Go version, so a warm run builds nothing. Every peer shares one module cache and one build
cache (``$GDC_CACHE/go/``): the Kubernetes libraries two peers share compile once.

    python tests/integration/cluster/peers.py lock    # after editing peers.toml
    python tests/integration/cluster/peers.py build   # what `nox -s cluster` does first
    python tests/integration/cluster/peers.py list    # their names
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PINS = HERE / "peers.toml"
LOCKS = HERE / "peers"
CACHE_ENV = "GDC_CACHE"
LAYOUT = "v1"  # bump to rebuild every cached peer
STAGING = "./staging/src/"  # k8s.io/kubernetes's replaces of its own staging modules


@dataclass(frozen=True)
class Peer:
    name: str
    module: str
    version: str
    packages: tuple[str, ...]
    staging: str  # k8s.io/kubernetes only: the published version of its staging modules
    ldflags: str  # what the peer's own release build stamps in (its version), if anything

    @property
    def lock_dir(self) -> Path:
        return LOCKS / self.name

    @property
    def binaries(self) -> tuple[str, ...]:
        return tuple(package.rsplit("/", 1)[-1] for package in self.packages)

    @property
    def import_paths(self) -> tuple[str, ...]:
        return tuple(f"{self.module}/{package}" for package in self.packages)


def load(pins: Path = PINS) -> dict[str, Peer]:
    """The peers to build (peers.toml's tables but ``unserved``)."""
    tables = tomllib.loads(pins.read_text())
    return {
        name: Peer(
            name,
            table["module"],
            table["version"],
            tuple(table["packages"]),
            table.get("staging", ""),
            table.get("ldflags", ""),
        )
        for name, table in tables.items()
        if name != "unserved"
    }


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "gpu-driver-container"


def go_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """One module cache and one build cache for every peer; the machine's own Go (no toolchain
    download behind our back)."""
    root = cache_root() / "go"
    return {
        **os.environ,
        "GOMODCACHE": str(root / "mod"),
        "GOCACHE": str(root / "build"),
        "GOTOOLCHAIN": "local",
        "GOFLAGS": "-mod=readonly -trimpath",
        "CGO_ENABLED": "0",
        **(extra or {}),
    }


def _go(args: list[str], cwd: Path, env: Mapping[str, str]) -> str:
    import subprocess  # noqa: PLC0415 - the one place peers.py runs a command

    if shutil.which("go", path=env.get("PATH")) is None:
        raise RuntimeError(
            "go is not on PATH: the cluster session builds its peers with Go 1.26 "
            "(docs/development.md, section 3); install it or add it to PATH"
        )
    result = subprocess.run(["go", *args], cwd=cwd, env=dict(env), capture_output=True,
                            text=True, check=False, timeout=3600)  # fmt: skip
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"go {' '.join(args)} failed in {cwd} ({result.returncode}):\n{tail}")
    return result.stdout


# --- lock ------------------------------------------------------------------------------------


def _replaces(peer: Peer, scratch: Path) -> list[str]:
    """The peer's own go.mod replaces, which a module requiring it does not inherit: versioned
    ones as they are, k8s.io/kubernetes's staging paths as their published modules."""
    env = go_env({"GOFLAGS": ""})  # no go.mod here: -mod has no meaning
    info = json.loads(_go(["mod", "download", "-json", f"{peer.module}@{peer.version}"],
                          scratch, env))  # fmt: skip
    edited = json.loads(_go(["mod", "edit", "-json", info["GoMod"]], scratch, env))
    lines = []
    for replace in edited.get("Replace") or []:
        old, new = replace["Old"]["Path"], replace["New"]
        if new.get("Version"):
            lines.append(f"{old} => {new['Path']} {new['Version']}")
        elif new["Path"].startswith(STAGING) and peer.staging:
            lines.append(f"{old} => {old} {peer.staging}")
        elif new["Path"].startswith(STAGING):
            raise RuntimeError(f"{peer.name}: {old} is a staging module: set staging in peers.toml")
    return lines


def lock(peer: Peer) -> None:
    """peers/<name>/go.mod and go.sum for the pinned version (go mod tidy, from the proxy)."""
    peer.lock_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        replaces = _replaces(peer, Path(scratch))
    text = [
        f"// Made by peers.py lock from peers.toml: {peer.module} {peer.version}.",
        f"module gpu-driver-container/tests/integration/cluster/peers/{peer.name}",
        "",
        "go 1.26.0",
        "",
        *(f"tool {path}" for path in peer.import_paths),
        "",
        f"require {peer.module} {peer.version}",
    ]
    if replaces:
        text += ["", "replace (", *(f"\t{line}" for line in replaces), ")"]
    (peer.lock_dir / "go.mod").write_text("\n".join(text) + "\n")
    (peer.lock_dir / "go.sum").unlink(missing_ok=True)
    _go(["mod", "tidy"], peer.lock_dir, go_env({"GOFLAGS": "-mod=mod"}))


# --- build -----------------------------------------------------------------------------------


def _key(peer: Peer, go_version: str) -> str:
    digest = hashlib.sha256()
    for part in (LAYOUT, go_version, peer.ldflags, *peer.packages):
        digest.update(part.encode() + b"\0")
    for name in ("go.mod", "go.sum"):
        digest.update((peer.lock_dir / name).read_bytes())
    return digest.hexdigest()[:12]


def built_dir(peer: Peer, go_version: str) -> Path:
    return cache_root() / "peers" / f"{peer.name}-{peer.version}-{_key(peer, go_version)}"


def build(peer: Peer) -> Path:
    """The directory holding the peer's binaries, built unless the cache has them."""
    env = go_env()
    go_version = _go(["env", "GOVERSION"], peer.lock_dir, env).strip()
    target = built_dir(peer, go_version)
    if all((target / binary).is_file() for binary in peer.binaries):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        ldflags = [f"-ldflags={peer.ldflags}"] if peer.ldflags else []
        _go(["build", *ldflags, "-o", f"{staging}/", *peer.import_paths], peer.lock_dir, env)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)  # whole, or not at all
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def module_dir(peer: Peer) -> Path:
    """The peer's module as the build read it (the Operator's assets/ and CRDs come from here)."""
    env = go_env()
    return Path(_go(["list", "-m", "-f", "{{.Dir}}", peer.module], peer.lock_dir, env).strip())


def main(argv: list[str]) -> int:
    if len(argv) < 1 or argv[0] not in {"lock", "build", "list"}:
        print("usage: peers.py lock|build|list [name ...]", file=sys.stderr)
        return 2
    peers = load()
    if argv[0] == "list":
        print("\n".join(peers))
        return 0
    chosen = argv[1:] or list(peers)
    unknown = sorted(set(chosen) - set(peers))
    if unknown:
        print(f"unknown peers {unknown}: peers.toml names {sorted(peers)}", file=sys.stderr)
        return 2
    for name in chosen:
        if argv[0] == "lock":
            lock(peers[name])
            print(f"{name}: locked {peers[name].module} {peers[name].version}")
        else:
            print(f"{name}: {build(peers[name])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
