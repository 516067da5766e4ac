"""The cluster session's peers are pinned: peers.toml and its lock (peers/<name>/go.mod, go.sum)
agree, and every module the build reads has its hash (no network: the files are read)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

CLUSTER = Path(__file__).resolve().parents[1] / "integration" / "cluster"


def _peers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cluster_peers", CLUSTER / "peers.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


PEERS = _peers()
PINNED = PEERS.load()


def _requires(go_mod: str) -> dict[str, str]:
    lines = re.findall(r"^\s*(?:require\s+)?([a-z0-9./\-_~!A-Z]+) (v[^\s]+)", go_mod, re.MULTILINE)
    return dict(lines)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_the_lock_requires_the_pinned_version(name: str) -> None:
    peer = PINNED[name]
    go_mod = (peer.lock_dir / "go.mod").read_text()
    assert _requires(go_mod).get(peer.module) == peer.version
    tools = re.findall(r"^tool (\S+)$", go_mod, re.MULTILINE)
    assert tools == list(peer.import_paths)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_every_required_module_has_its_hash(name: str) -> None:
    peer = PINNED[name]
    go_mod = (peer.lock_dir / "go.mod").read_text()
    go_sum = (peer.lock_dir / "go.sum").read_text()
    # A required module that is replaced is read at its replacement's version (replaces of
    # modules no build reads need no hash).
    replaced = dict(re.findall(r"^\s*(\S+) => \S+ (v\S+)$", go_mod, re.MULTILINE))
    for module, version in _requires(go_mod).items():
        pinned = replaced.get(module, version)
        assert f"{module} {pinned}/go.mod h1:" in go_sum, (module, pinned)
    assert f"{peer.module} {peer.version} h1:" in go_sum


def test_kubernetes_staging_modules_are_replaced_by_their_published_release() -> None:
    peer = PINNED["kube-apiserver"]
    go_mod = (peer.lock_dir / "go.mod").read_text()
    assert "./staging" not in go_mod
    assert re.search(rf"k8s.io/client-go => k8s.io/client-go {re.escape(peer.staging)}$", go_mod,
                     re.MULTILINE)  # fmt: skip
