"""invoke propose-peers with the peers' tags and the Go module proxy's answers faked through the
command seam (git ls-remote, go list -m -json): no network."""

from __future__ import annotations

import json
import os
import re
import shutil
import tomllib
from collections.abc import Sequence
from pathlib import Path

import pull_requests
import pytest
import tasks
from invoke.context import MockContext
from invoke.exceptions import Exit

from gdc import peers
from gdc.propose import Repository

PEERS_TOML = Path(__file__).parents[3] / "tests" / "integration" / "cluster" / "peers.toml"
TODAY = PEERS_TOML.read_text()
REFUSED = (
    "{0}: reading https://proxy.golang.org/{1}/@v/{2}.info: 403 Forbidden\n"
    "\tserver response: This module version is not available."
)
OPERATOR = "github.com/NVIDIA/gpu-operator"
OPERATOR_COMMIT = "10ee5b3638b8" + "0" * 28
OPERATOR_PSEUDO = "v0.0.0-20260821000907-10ee5b3638b8"
FLUO = "github.com/flatcar/flatcar-linux-update-operator"
KURED = "github.com/kubereboot/kured"


def _ls_remote(*tags: tuple[str, str]) -> str:
    return "".join(f"{commit}\trefs/tags/{tag}\n" for tag, commit in tags)


def _commit(n: int) -> str:
    return f"{n:040x}"


# Upstream as it may be one night: kube-apiserver v1.36.4 and the Operator's v26.7.0 served,
# FLUO's v0.10.0 refused (peers.toml names it already), nothing newer than kured 1.16.1.
TAGS = {
    "https://github.com/kubernetes/kubernetes": _ls_remote(
        ("v1.36.3", _commit(1)), ("v1.36.4", _commit(2)), ("v1.37.0-rc.1", _commit(3)),
        ("v1.37.0-alpha.0", _commit(4)),
    ),
    "https://github.com/NVIDIA/gpu-operator": _ls_remote(
        ("v25.3.4", _commit(5)), ("v26.7.0", _commit(6)), ("v26.7.0^{}", OPERATOR_COMMIT),
        ("v26.10.0-rc.1", _commit(7)), ("helm-chart-v1", _commit(8)),
    ),
    "https://github.com/flatcar/flatcar-linux-update-operator": _ls_remote(
        ("v0.9.0", _commit(9)), ("v0.10.0-rc1", _commit(10)), ("v0.10.0-rc2", _commit(11)),
        ("v0.10.0", _commit(12)),
    ),
    "https://github.com/kubereboot/kured": _ls_remote(
        ("1.16.0", _commit(13)), ("1.16.1", _commit(14)), ("1.17.0-rc.1", _commit(15)),
    ),
}  # fmt: skip
SERVED = {
    "k8s.io/kubernetes@v1.36.4": "v1.36.4",
    "k8s.io/client-go@v0.36.4": "v0.36.4",
    f"{OPERATOR}@{OPERATOR_COMMIT}": OPERATOR_PSEUDO,
}


class Seam:
    """commands.output as the peers' repositories and the proxy answer: the calls, logged."""

    def __init__(self, tags: dict[str, str], served: dict[str, str]) -> None:
        self.tags, self.served, self.calls = tags, served, list[list[str]]()

    def __call__(self, argv: Sequence[str]) -> tuple[int, str]:
        self.calls.append(list(argv))
        if argv[:3] == ["git", "ls-remote", "--tags"]:
            return (0, self.tags[argv[3]]) if argv[3] in self.tags else (128, "")
        assert list(argv[:5]) == ["go", "list", "-m", "-e", "-json"], argv
        module, _, ref = argv[5].partition("@")
        if argv[5] in self.served:
            return 0, json.dumps({"Path": module, "Version": self.served[argv[5]]})
        error = REFUSED.format(argv[5], module, ref)
        return 0, json.dumps({"Path": module, "Version": ref, "Error": {"Err": error}})


def _proposer(path: Path, seam: Seam, said: list[str], **kwargs: object) -> peers.PeerProposer:
    return peers.PeerProposer(path, said.append, upstream=peers.Upstream(seam), **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def pins(tmp_path: Path) -> Path:
    path = tmp_path / "repo" / "tests" / "integration" / "cluster" / "peers.toml"
    path.parent.mkdir(parents=True)
    path.write_text(TODAY)
    return path


# --- versions and tags ---------------------------------------------------------------------------


def test_a_tag_that_is_no_module_version_of_its_path_is_pinned_by_commit() -> None:
    assert peers.is_module_version("k8s.io/kubernetes", "v1.36.4")
    assert peers.is_module_version(FLUO, "v0.10.0-rc2")
    assert not peers.is_module_version(OPERATOR, "v26.7.0"), "no /v26 in its path"
    assert not peers.is_module_version(KURED, "1.16.2"), "no leading v"
    assert peers.is_module_version("go.etcd.io/etcd/server/v3", "v3.6.1")
    assert not peers.is_module_version("go.etcd.io/etcd/server/v3", "v1.0.0")


def test_annotated_tags_are_their_commit_and_other_refs_are_ignored() -> None:
    answer = _ls_remote(("v1", "a" * 40), ("v1^{}", "b" * 40), ("v2", "c" * 40))
    assert peers.tags(answer + f"{'d' * 40}\trefs/heads/main\n") == {"v1": "b" * 40, "v2": "c" * 40}


def _newest(release: str, *tags: str) -> str | None:
    pin = peers.Pin("p", FLUO, release, "", "")
    found = peers.newest(pin, {tag: _commit(n) for n, tag in enumerate(tags)})
    return None if found is None else found.tag


def test_the_newest_final_release_counts_not_a_pre_release() -> None:
    assert (
        _newest("v1.36.3", "v1.36.4", "v1.37.0-rc.1", "v1.36.10", "junk", "v1.36.2") == "v1.36.10"
    )
    assert _newest("1.16.1", "1.16.0", "1.16.2", "1.17.0-rc.1") == "1.16.2"
    assert _newest("v1.36.3", "v1.36.3", "v1.37.0-alpha.0") is None


def test_a_pre_release_pin_takes_a_newer_one_of_its_line_or_its_final() -> None:
    assert _newest("v0.10.0-rc2", "v0.9.0", "v0.10.0-rc1", "v0.10.0-rc10") == "v0.10.0-rc10"
    assert _newest("v0.10.0-rc2", "v0.10.0-rc3", "v0.10.0") == "v0.10.0"
    assert _newest("v0.10.0-rc2", "v0.11.0-rc1") is None, "another line's pre-release"
    assert _newest("v0.10.0-rc2", "v0.11.0-rc1", "v0.10.1") == "v0.10.1"


# --- the proposals, dry -----------------------------------------------------------------------


def test_the_dry_run_proposes_each_served_newer_release_and_notes_the_refused(
    pins: Path,
) -> None:
    seam, said = Seam(TAGS, SERVED), list[str]()
    proposals = _proposer(pins, seam, said).propose()
    assert pins.read_text() == TODAY, "a dry run changes nothing"
    assert [proposal.branch for proposal in proposals] == [
        "bump-peer/kube-apiserver-v1.36.4",
        "bump-peer/gpu-operator-v26.7.0",
    ]
    notes = [line for line in said if not line.startswith(("---", "+++", "@@", " ", "-", "+"))]
    refused = REFUSED.format(f"{FLUO}@v0.10.0", FLUO, "v0.10.0").replace("\n\t", " ")
    assert notes == [
        "kube-apiserver: v1.36.4 (v1.36.4) replaces v1.36.3",
        "kube-apiserver: v1.36.4: dry run: no lock, no branch, no pull request",
        (
            f"gpu-operator: v26.7.0 is not a version of {OPERATOR}: its commit 10ee5b3638b8 is "
            f"{OPERATOR_PSEUDO}"
        ),
        f"gpu-operator: v26.7.0 ({OPERATOR_PSEUDO}) replaces v25.3.4",
        "gpu-operator: v26.7.0: dry run: no lock, no branch, no pull request",
        (
            "fluo: v0.10.0 is newer than v0.10.0-rc2, but the Go module proxy refuses it: "
            f"{refused}; fluo stays at v0.10.0-rc2"
        ),
        "kured: 1.16.1 is the newest release of https://github.com/kubereboot/kured",
    ]
    asked = [call[5] for call in seam.calls if call[0] == "go"]
    assert asked == [
        "k8s.io/kubernetes@v1.36.4",
        "k8s.io/client-go@v0.36.4",
        f"{OPERATOR}@{OPERATOR_COMMIT}",  # the annotated tag's commit
        f"{FLUO}@v0.10.0",
    ]


# Each repository's tags up to its pinned release: nothing newer.
CURRENT = {
    url: _ls_remote((pin.release, _commit(n)))
    for n, (url, pin) in enumerate(zip(TAGS, peers.load(TODAY), strict=True))
}


def _comments(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.lstrip().startswith("#")]


def test_a_bump_rewrites_only_its_peer_s_table_and_keeps_every_comment(pins: Path) -> None:
    kube, operator = _proposer(pins, Seam(TAGS, SERVED), []).propose()
    before = tomllib.loads(TODAY)
    after = tomllib.loads(kube.text)
    assert after["kube-apiserver"] == {
        **before["kube-apiserver"],
        "version": "v1.36.4",
        "staging": "v0.36.4",
        "ldflags": before["kube-apiserver"]["ldflags"].replace("=v1.36.3 ", "=v1.36.4 "),
    }
    assert {k: v for k, v in after.items() if k != "kube-apiserver"} == {
        k: v for k, v in before.items() if k != "kube-apiserver"
    }
    assert _comments(kube.text) == _comments(TODAY)
    assert "tag" not in after["kube-apiserver"], "its tags are module versions"
    changed = [
        line for line in kube.diff.splitlines() if line.startswith("+") and "+++" not in line
    ]
    assert len(changed) == 3, changed  # version, staging, the ldflags' gitVersion line

    after = tomllib.loads(operator.text)
    assert after["gpu-operator"] == {
        **before["gpu-operator"],
        "tag": "v26.7.0",
        "version": OPERATOR_PSEUDO,
    }
    # Its newest release is served: its unserved table goes, the others stay.
    assert set(after["unserved"]) == set(before["unserved"]) - {"gpu-operator"}
    assert {k: v for k, v in after.items() if k not in {"gpu-operator", "unserved"}} == {
        k: v for k, v in before.items() if k not in {"gpu-operator", "unserved"}
    }
    assert _comments(operator.text) == _comments(TODAY)


def test_a_new_minor_release_moves_the_staging_modules_and_the_stamped_version() -> None:
    pin = peers.load(TODAY)[0]
    text = peers.bumped(TODAY, pin, peers.Release("v1.37.0", _commit(1)), "v1.37.0")
    table = tomllib.loads(text)["kube-apiserver"]
    assert table["staging"] == "v0.37.0"
    assert "gitVersion=v1.37.0 " in table["ldflags"]
    assert "gitMinor=37 " in table["ldflags"]
    assert "gitMajor=1 " in table["ldflags"]


def test_a_valid_tag_of_a_peer_pinned_with_one_keeps_its_tag_in_step(pins: Path) -> None:
    served = {f"{FLUO}@v0.10.0": "v0.10.0"}
    proposals = {p.pin.name: p for p in _proposer(pins, Seam(TAGS, served), []).propose()}
    after = tomllib.loads(proposals["fluo"].text)
    assert (after["fluo"]["tag"], after["fluo"]["version"]) == ("v0.10.0", "v0.10.0")
    assert "fluo" not in after["unserved"]
    # kube-apiserver v1.36.4 refused: a new unserved table names it; the Operator's v26.7.0,
    # refused too, is named already.
    assert set(proposals) == {"kube-apiserver", "fluo"}
    added = tomllib.loads(proposals["kube-apiserver"].text)["unserved"]["kube-apiserver"]
    assert added == {
        "module": "k8s.io/kubernetes",
        "tags": ["v1.36.4"],
        "reason": "kube-apiserver stays at v1.36.3",
    }


def test_a_refused_release_peers_toml_does_not_name_is_added_to_unserved(pins: Path) -> None:
    tags = {**TAGS, "https://github.com/kubereboot/kured": _ls_remote(("1.24.0", _commit(20)))}
    said = list[str]()
    proposals = _proposer(pins, Seam(tags, SERVED), said).propose()
    [kured] = [proposal for proposal in proposals if proposal.pin.name == "kured"]
    assert kured.branch == "unserved-peer/kured-1.24.0"
    assert not kured.lock
    after = tomllib.loads(kured.text)
    assert after["kured"] == tomllib.loads(TODAY)["kured"], "the peer stays"
    assert after["unserved"]["kured"]["tags"][0] == "1.24.0"
    noted = f"kured: 1.24.0 is newer than 1.16.1, but the Go module proxy refuses it: {KURED}@"
    assert any(line.startswith(f"{noted}{_commit(20)}: ") for line in said)
    assert _comments(kured.text) == _comments(TODAY)


def test_nothing_newer_is_nothing_done(pins: Path) -> None:
    seam, said = Seam(CURRENT, {}), list[str]()
    assert _proposer(pins, seam, said).propose() == []
    assert len(said) == 4
    assert all(" is the newest release of https://github.com/" in line for line in said)
    assert not [call for call in seam.calls if call[0] == "go"]


def test_an_unreachable_repository_fails_that_peer_after_the_others(pins: Path) -> None:
    tags = {url: answer for url, answer in TAGS.items() if "kured" not in url}
    said = list[str]()
    with pytest.raises(peers.PeerError, match=r"^1 of 4 peers were not checked or proposed"):
        _proposer(pins, Seam(tags, SERVED), said).propose()
    assert "kured: git ls-remote --tags https://github.com/kubereboot/kured exited 128" in said


# --- the task, with git and go stubbed on PATH -------------------------------------------------


def test_invoke_propose_peers_dry_run(
    pins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = tmp_path / "answers"
    answers.mkdir()
    for url, answer in TAGS.items():
        (answers / url.rsplit("/", 1)[-1]).write_text(answer)
    for asked, version in SERVED.items():
        module = asked.partition("@")[0]
        answer = json.dumps({"Path": module, "Version": version})
        (answers / re.sub(r"[/@]", "_", asked)).write_text(answer)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pull_requests.stub(bin_dir, "git", f'cat "{answers}/$(basename "$3")"\n')
    refused = json.dumps({"Error": {"Err": "403 Forbidden\n\tserver response: not available"}})
    found = f"f={answers}/$(echo \"$5\" | tr '/@' '__')\n"
    pull_requests.stub(
        bin_dir,
        "go",
        f"{found}if [ -f \"$f\" ]; then cat \"$f\"; else printf '%s\\n' '{refused}'; fi\n",
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    tasks.propose_peers(MockContext(), dry_run=True, peers_file=str(pins))
    out = capsys.readouterr().out
    assert pins.read_text() == TODAY
    assert 'invoke propose-peers: +version = "v1.36.4"' not in out, "the diff is one message"
    assert '+version = "v1.36.4"\n' in out
    assert (
        "invoke propose-peers: fluo: v0.10.0 is newer than v0.10.0-rc2, but the Go module "
        "proxy refuses it: 403 Forbidden server response: not available; fluo stays" in out
    )
    assert out.splitlines()[-1] == "invoke propose-peers: 2 proposals (dry run)"


# --- the pull request, with git and a stub gh ---------------------------------------------------


@pytest.fixture
def repo(pins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pins' repository on main with a lock of each peer, pushed to a bare origin; gh a stub."""
    for pin in peers.load(TODAY):
        lock = pins.parent / "peers" / pin.name
        lock.mkdir(parents=True)
        (lock / "go.mod").write_text(f"require {pin.module} {pin.version}\n")
    return pull_requests.make_repository(tmp_path / "repo", tmp_path, monkeypatch)


def test_a_bump_is_locked_committed_pushed_and_opened_once(
    pins: Path, repo: Path, tmp_path: Path
) -> None:
    locked = list[list[str]]()

    def lock(argv: Sequence[str]) -> int:  # peers.py lock <name>, as it writes the lock
        locked.append(list(argv))
        name = argv[-1]
        version = tomllib.loads(pins.read_text())[name]["version"]
        (pins.parent / "peers" / name / "go.mod").write_text(f"locked {version}\n")
        return 0

    operator = "https://github.com/NVIDIA/gpu-operator"
    tags = {**CURRENT, operator: TAGS[operator]}
    said = list[str]()
    repository = Repository(repo.resolve(), "propose-peers")
    proposer = _proposer(pins, Seam(tags, SERVED), said, repository=repository, run=lock)
    [proposal] = proposer.propose()
    assert f"gpu-operator: v26.7.0: opened {pull_requests.URL}" in said
    assert [argv[-3:] for argv in locked] == [[str(pins.parent / "peers.py"), "lock",
                                               "gpu-operator"]]  # fmt: skip
    branch = "bump-peer/gpu-operator-v26.7.0"
    origin = tmp_path / "origin.git"
    path = "tests/integration/cluster"
    assert pull_requests.git(origin, "show", f"{branch}:{path}/peers.toml") == proposal.text
    assert pull_requests.git(origin, "show", f"{branch}:{path}/peers/gpu-operator/go.mod") == (
        f"locked {OPERATOR_PSEUDO}\n")  # fmt: skip
    assert pull_requests.git(origin, "log", "-1", "--format=%s", branch).strip() == (
        "peers.toml: gpu-operator v26.7.0 replaces v25.3.4"
    )
    assert pull_requests.git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert pull_requests.git(repo, "status", "--porcelain") == ""
    assert pins.read_text() == TODAY
    (tmp_path / "gh.prs").write_text("1\n")
    said.clear()
    _proposer(pins, Seam(tags, SERVED), said, repository=repository, run=lock).propose()
    assert f"gpu-operator: v26.7.0: already proposed (a pull request from {branch} exists)" in said
    assert len(locked) == 1


def test_a_failed_lock_leaves_the_repository_as_it_was(pins: Path, repo: Path) -> None:
    def lock(argv: Sequence[str]) -> int:
        (pins.parent / "peers" / argv[-1] / "go.mod").write_text("half\n")
        return 1

    repository = Repository(repo.resolve(), "propose-peers")
    said = list[str]()
    with pytest.raises(peers.PeerError, match="2 of 4 peers"):
        _proposer(pins, Seam(TAGS, SERVED), said, repository=repository, run=lock).propose()
    assert "kube-apiserver: peers.py lock kube-apiserver exited 1" in said
    assert pull_requests.git(repo, "status", "--porcelain") == ""
    assert pull_requests.git(repo, "branch", "--list", "bump-peer/*") == ""


def test_uncommitted_changes_stop_it_before_any_lookup(pins: Path, repo: Path) -> None:
    pins.write_text(TODAY + "\n# a local edit\n")
    with pytest.raises(Exit, match="has uncommitted changes: propose-peers commits on branches "):
        tasks.propose_peers(MockContext(), peers_file=str(pins))
    shutil.rmtree(repo / ".git")
    with pytest.raises(Exit, match="is not in a git work tree: propose-peers commits to it"):
        tasks.propose_peers(MockContext(), peers_file=str(pins))
