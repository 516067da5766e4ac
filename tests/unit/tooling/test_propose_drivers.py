"""invoke propose-drivers against NVIDIA's releases list and download tree on 127.0.0.1."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import nvidia_tree
import pull_requests
import pytest
import tasks
import yaml
from fetch_server import ReleaseServer
from invoke.context import MockContext
from invoke.exceptions import Exit

from gdc import propose, versions_text
from gdc.nvidia import RecordError, newest_releases
from gdc.tags import build_image_tags

TODAY_TEXT, TODAY, todo_entry = nvidia_tree.TODAY_TEXT, nvidia_tree.TODAY, nvidia_tree.todo_entry
LTS = next(driver for driver in TODAY.drivers if driver.branch == "580")
OLDER = "580.173.02"  # the 580 release before 580.178.04 in NVIDIA's list
ROOT = Path(__file__).parents[3]
WORKFLOWS = ROOT / ".github" / "workflows"
KURED = yaml.safe_load(
    (ROOT / "deploy" / "reboot-gate" / "kured" / "kustomization.yaml").read_text()
)
GATE_TODAY = KURED["images"][0]["newTag"]  # the build image the gate's manifests run


def gate_tag(driver: str) -> str:
    return build_image_tags(driver, ())[0]


def _gate_runs(repo: Path, driver: str) -> None:
    """This repository's reboot gate manifests, in repo, running driver's build image."""
    for name in propose.GATE_IMAGE_FILES:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        text = propose.moved_gate_image((ROOT / name).read_text(), GATE_TODAY, gate_tag(driver))
        (repo / name).write_text(text)


@pytest.fixture
def nvidia(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ReleaseServer]:
    root = tmp_path / "nvidia"
    for driver in TODAY.drivers:
        nvidia_tree.lay_out(root, driver)
    nvidia_tree.write_releases(root)
    for name, value in nvidia_tree.TRUST_LOOPBACK.items():
        monkeypatch.setenv(name, value)
    with ReleaseServer(root) as server:
        yield server


@pytest.fixture
def behind(tmp_path: Path) -> Path:
    """versions.toml as today, but with the 580 branch one release behind (not recorded yet)."""
    path = tmp_path / "repo" / "versions.toml"
    path.parent.mkdir()
    path.write_text(versions_text.put_entry(TODAY_TEXT, todo_entry(OLDER), OLDER, LTS.version))
    return path


def _options(server: ReleaseServer, path: Path) -> dict[str, str]:
    upstream = nvidia_tree.upstream(server)
    return {
        "versions_file": str(path),
        "releases_url": upstream.releases_list_url(),
        "checksum_base_url": upstream.checksum_base_url,
        "driver_base_url": upstream.driver_base_url,
        "fabricmanager_base_url": upstream.redist_base_url,
    }


def test_the_dry_run_proposes_the_newer_point_release_of_a_tracked_branch(
    nvidia: ReleaseServer, behind: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = behind.read_text()
    tasks.propose_drivers(MockContext(), dry_run=True, **_options(nvidia, behind))
    assert behind.read_text() == before, "a dry run changes nothing"
    out = capsys.readouterr().out
    lines = [line.removeprefix("invoke propose-drivers: ") for line in out.splitlines()]
    assert lines[:4] == [
        "595: 595.91.07 is the newest release NVIDIA lists",
        "610: NVIDIA's list has no branch 610; 610.57.04 stays",
        *(
            f"{branch} ({kind}, {version}) is not tracked in versions.toml: "
            f"`invoke record-driver {version}` adds it"
            for branch, kind, version in (
                ("460", "production branch", "460.106.00"),
                ("615", "new feature branch", "615.71.09"),
            )
        ),
    ]
    assert lines[4] == f"580: {LTS.version} (lts branch, released 2026-08-03) replaces {OLDER}"
    diff = out[
        out.index("--- a/versions.toml") : out.index(f"invoke propose-drivers: {LTS.version}:")
    ]
    assert f'-[drivers."{OLDER}"]\n' in diff
    assert f'+[drivers."{LTS.version}"]\n' in diff
    assert f'+sha256.amd64 = "{LTS.sha256["amd64"]}"  # ' in diff
    summary = ".run amd64, arm64; redist fabricmanager, libnvidia_nscq; TODO: nvlsm, imex, libnvsdm"
    # The others' entries have TODOs: recorded again, with nothing new from NVIDIA (the test
    # tree lists no more than versions.toml records).
    assert lines[-6:] == [
        f"{LTS.version}: {summary} (dry run: no branch, no pull request)",
        "595: 595.91.07 has TODO values: recording it again",
        "595.91.07: NVIDIA's files give nothing versions.toml lacks",
        "610: 610.57.04 has TODO values: recording it again",
        "610.57.04: NVIDIA's files give nothing versions.toml lacks",
        "1 proposal (dry run)",
    ]
    # What it adds is today's entry of the branch, value for value.
    added = "\n".join(
        line[1:]
        for line in diff.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    )
    assert tomllib.loads(added)["drivers"] == {
        LTS.version: tomllib.loads(TODAY_TEXT)["drivers"][LTS.version]
    }


def test_a_proposal_that_replaces_the_gate_s_driver_moves_the_gate_s_manifests_too(
    nvidia: ReleaseServer, behind: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The gate's manifests must run the build image of a driver versions.toml lists
    (tests/unit/gate/test_manifests.py): a pull request that replaces that driver and left them
    naming it failed nox -s tests until someone edited them by hand."""
    _gate_runs(behind.parent, OLDER)
    before = {name: (behind.parent / name).read_text() for name in propose.GATE_IMAGE_FILES}
    tasks.propose_drivers(MockContext(), dry_run=True, **_options(nvidia, behind))
    out = capsys.readouterr().out
    old, new = gate_tag(OLDER), gate_tag(LTS.version)
    for name, text in before.items():
        assert (behind.parent / name).read_text() == text, "a dry run changes nothing"
        assert f"--- a/{name.as_posix()}\n" in out
    assert out.count(f"-  newTag: {old}\n") == out.count(f"+  newTag: {new}\n") == 2
    image = f'image: "{KURED["images"][0]["name"]}:'
    assert out.count(f'{image}{old}"\n') == out.count(f'{image}{new}"\n') == 3
    proposer = propose.Proposer(behind, nvidia_tree.upstream(nvidia), os.environ, "2026-12-05")
    [proposal] = [p for p in proposer.run() if p.candidate.tracked == OLDER]
    assert proposal.gate == new
    for path, text in proposal.files.items():
        if path != behind:
            assert text == before[path.relative_to(behind.parent)].replace(old, new)


def test_a_proposal_that_replaces_another_driver_leaves_the_gate_s_manifests_alone(
    nvidia: ReleaseServer, behind: Path
) -> None:
    _gate_runs(behind.parent, next(d.version for d in TODAY.drivers if d.branch != "580"))
    proposer = propose.Proposer(behind, nvidia_tree.upstream(nvidia), os.environ, "2026-12-05")
    [proposal] = [p for p in proposer.run() if p.candidate.tracked == OLDER]
    assert list(proposal.files) == [behind]
    assert "reboot-gate" not in proposal.diff
    assert proposal.gate == ""


def test_a_newer_release_whose_manifest_lacks_a_required_archive_is_not_proposed_yet(
    nvidia: ReleaseServer, behind: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """NVIDIA lists the release, but its redistrib json has no fabric manager for linux-sbsa
    yet: the entry would say TODO there, and invoke build refuses such a driver
    (redist.REQUIRED_KEYS, read by gdc.plan), so merged it would leave the branch with no arm64
    image, and (the arches merged together) no image at all for the next Flatcar release."""
    manifest = nvidia_tree.manifest_of(LTS)
    del manifest["fabricmanager"]["linux-sbsa"]
    nvidia_tree.write_manifest(nvidia.root, LTS.version, manifest)
    proposer = propose.Proposer(behind, nvidia_tree.upstream(nvidia), os.environ, "2026-12-05")
    assert [p.record.version for p in proposer.run()] == []
    assert (
        f"{LTS.version}: not proposed yet: redistrib_{LTS.version}.json lists no fabricmanager "
        f"for linux-sbsa, without which invoke build refuses the driver; {OLDER} stays, the "
        "next run tries again\n"
    ) in capsys.readouterr().out


def test_an_entry_with_todo_values_is_proposed_again_once_nvidia_s_files_give_them(
    nvidia: ReleaseServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stand-in release (no NVIDIA branch 999) whose manifest lists NVLSM: the AUR's real
    2025.06.11 digests, paired with no real driver."""
    stand_in, nvlsm = nvidia_tree.STAND_IN, nvidia_tree.NVLSM_AUR
    for arch in ("amd64", "arm64"):
        nvidia_tree.stand_in_run(nvidia.root, stand_in, arch)
    nvidia_tree.write_manifest(nvidia.root, stand_in, {"release_label": stand_in})
    path = tmp_path / "versions.toml"
    path.write_text(TODAY_TEXT)
    options = {key: value for key, value in _options(nvidia, path).items() if key != "releases_url"}
    tasks.record_driver(MockContext(), stand_in, **options)
    digests = {"linux-x86_64": nvlsm[1], "linux-sbsa": nvlsm[2]}
    nvlsm_listed = nvidia_tree.listed("nvlsm", nvlsm[0], digests)
    nvidia_tree.write_manifest(
        nvidia.root, stand_in, {"release_label": stand_in, "nvlsm": nvlsm_listed}
    )
    capsys.readouterr()
    proposer = propose.Proposer(path, nvidia_tree.upstream(nvidia), os.environ, "2026-12-05")
    [proposal] = [p for p in proposer.run() if p.record.version == stand_in]
    out = capsys.readouterr().out
    assert "999: NVIDIA's list has no branch 999; 999.1.1 stays\n" in out
    assert "999: 999.1.1 has TODO values: recording it again\n" in out
    assert proposal.title == "versions.toml: driver 999.1.1's TODO values, from NVIDIA's files"
    assert re.fullmatch(r"record-driver/999\.1\.1-[0-9a-f]{8}", proposal.branch)
    assert (
        f'+nvlsm = {{ version = "2025.06.11", amd64 = "{nvlsm[1]}", arm64 = "{nvlsm[2]}" }}'
        in proposal.diff
    )


def test_a_list_that_is_not_nvidia_s_is_refused_in_one_line(
    nvidia: ReleaseServer, behind: Path
) -> None:
    nvidia_tree.write_releases(nvidia.root, {"580": {"type": "lts branch", "driver_info": []}})
    with pytest.raises(Exit, match=r"lists no driver release: not NVIDIA's list of releases$"):
        tasks.propose_drivers(MockContext(), dry_run=True, **_options(nvidia, behind))


def test_malformed_rows_and_releases_of_another_branch_are_skipped() -> None:
    feed = nvidia_tree.releases_json()
    feed["580"]["driver_info"] += [
        {"release_version": "595.99.99"},
        {"release_version": "x"},
        "row",
        {"release_version": "580.200.01", "release_notes": "http://elsewhere.example/"},
    ]
    newest = newest_releases(feed, "u")
    assert newest["580"].version == "580.200.01"
    assert newest["580"].notes == "", "only release notes on docs.nvidia.com are linked"
    assert newest["595"].notes == (
        "https://docs.nvidia.com/datacenter/tesla/tesla-release-notes-595-91-07/index.html"
    )
    with pytest.raises(RecordError, match="not NVIDIA's list of releases"):
        newest_releases([], "u")


# --- the pull request, with git and a stub gh ---------------------------------------------------


@pytest.fixture
def repo(behind: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """behind's repository on main, pushed to a bare origin; gh a stub that logs its calls."""
    return pull_requests.make_repository(behind.parent, tmp_path, monkeypatch)


def test_a_proposal_is_pushed_on_its_branch_and_opened_once(
    nvidia: ReleaseServer, repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    behind = repo / "versions.toml"
    before = behind.read_text()
    _gate_runs(repo, OLDER)
    pull_requests.git(repo, "add", ".")
    pull_requests.git(repo, "commit", "-q", "-m", "the gate runs the 580 branch's driver")
    tasks.propose_drivers(MockContext(), **_options(nvidia, behind))
    branch = f"record-driver/{LTS.version}"
    out = capsys.readouterr().out.splitlines()
    assert (
        f"invoke propose-drivers: {LTS.version}: opened "
        "https://github.com/o/gpu-driver-container/pull/7"
    ) in out
    assert out[-1] == "invoke propose-drivers: 1 proposal (1 pull request opened)"
    origin = tmp_path / "origin.git"
    proposed = pull_requests.git(origin, "show", f"{branch}:versions.toml")
    assert tomllib.loads(proposed) == tomllib.loads(TODAY_TEXT)
    for name in propose.GATE_IMAGE_FILES:  # the gate moves in the same commit
        moved = pull_requests.git(origin, "show", f"{branch}:{name.as_posix()}")
        assert moved == (repo / name).read_text().replace(gate_tag(OLDER), gate_tag(LTS.version))
    assert pull_requests.git(origin, "log", "-1", "--format=%s%n%an", branch).splitlines() == [
        f"versions.toml: driver {LTS.version} replaces {OLDER}",
        "github-actions[bot]",
    ]
    # Back where it started: main, versions.toml untouched, no branch left behind.
    assert pull_requests.git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert behind.read_text() == before
    assert pull_requests.git(repo, "branch", "--list", branch) == ""
    calls = (tmp_path / "gh.log").read_text().splitlines()
    assert calls[0] == f"pr list --head {branch} --state all --json number --jq length"
    assert calls[1].startswith(
        f"pr create --base main --head {branch} --title versions.toml: "
        f"driver {LTS.version} replaces {OLDER} --body NVIDIA's list"
    )
    body = (tmp_path / "gh.log").read_text()
    assert f"their `newTag:` and `image:` lines name `{gate_tag(LTS.version)}` now" in body
    (tmp_path / "gh.prs").write_text("1\n")
    tasks.propose_drivers(MockContext(), **_options(nvidia, behind))
    assert (
        f"{LTS.version}: already proposed (a pull request from {branch} exists)"
        in capsys.readouterr().out
    )
    calls = (tmp_path / "gh.log").read_text().splitlines()
    assert calls[-1].startswith("pr list")
    assert sum(call.startswith("pr create") for call in calls) == 1


def test_a_failed_record_leaves_the_repository_as_it_was(
    nvidia: ReleaseServer, repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    behind = repo / "versions.toml"
    nvidia_tree.write_manifest(nvidia.root, LTS.version, {"release_label": "580.65.06"})
    with pytest.raises(Exit, match=r": 1 of 3 drivers were not recorded or proposed \(see above\)"):
        tasks.propose_drivers(MockContext(), **_options(nvidia, behind))
    assert (
        f"invoke propose-drivers: {LTS.version}: redistrib_{LTS.version}.json has release_label "
        f"'580.65.06', not {LTS.version}: the manifest's versions disagree; nothing was written"
        in capsys.readouterr().out
    )
    assert pull_requests.git(repo, "status", "--porcelain") == ""
    assert not (tmp_path / "gh.log").exists(), "recorded first, into a scratch copy"


def test_a_failed_push_leaves_the_repository_as_it_was(
    nvidia: ReleaseServer, repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    behind = repo / "versions.toml"
    before = behind.read_text()
    pull_requests.git(repo, "remote", "set-url", "origin", str(tmp_path / "gone.git"))
    with pytest.raises(Exit, match=r": 1 of 3 drivers were not recorded or proposed"):
        tasks.propose_drivers(MockContext(), **_options(nvidia, behind))
    branch = f"record-driver/{LTS.version}"
    assert f"{LTS.version}: git -c credential.helper= " in capsys.readouterr().out
    assert pull_requests.git(repo, "status", "--porcelain") == ""
    assert behind.read_text() == before
    assert pull_requests.git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert pull_requests.git(repo, "branch", "--list", branch) == ""
    assert "pr create" not in (tmp_path / "gh.log").read_text()


def test_uncommitted_changes_stop_it_before_any_branch(nvidia: ReleaseServer, repo: Path) -> None:
    behind = repo / "versions.toml"
    behind.write_text(behind.read_text() + "\n# a local edit\n")
    with pytest.raises(Exit, match="has uncommitted changes: propose-drivers commits on branches "):
        tasks.propose_drivers(MockContext(), **_options(nvidia, behind))
    assert behind.read_text().endswith("# a local edit\n")


# --- the workflow --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workflow_file", "command"),
    [("drivers.yml", "invoke propose-drivers"), ("peers.yml", "invoke propose-peers")],
)
def test_the_workflow_only_calls_invoke_with_write_access_on_its_one_job(
    workflow_file: str, command: str
) -> None:
    workflow = yaml.safe_load((WORKFLOWS / workflow_file).read_text())
    assert workflow["permissions"] == {}
    [(name, job)] = workflow["jobs"].items()
    assert name == "propose"
    assert job["permissions"] == {"contents": "write", "pull-requests": "write"}
    runs = [step["run"] for step in job["steps"] if "run" in step]
    assert runs[-1] == command
    assert all(
        line.startswith("python -m pip install --require-hashes --no-deps -r requirements/")
        for run in runs[:-1]
        for line in run.strip().splitlines()
    )
    for step in job["steps"]:
        if "uses" in step:
            action, _, rest = step["uses"].partition("@")
            assert len(rest.split()[0]) == 40, f"{action} is pinned by commit"


# --- NVIDIA's words are shown, never obeyed ---------------------------------------------------


def test_nvidia_s_text_reaches_no_log_line_or_pull_request_raw(
    nvidia: ReleaseServer, repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    feed = nvidia_tree.releases_json()
    feed["580"]["type"] = "lts branch\n::add-mask::hidden\n::error::forged\x1b[2J"
    last = feed["580"]["driver_info"][-1]
    last["release_date"] = "2026-01-01\n::error title=x::forged"
    last["release_notes"] = "https://docs.nvidia.com/x\r\n::warning::forged"
    feed["615"]["type"] = "new feature branch\n::add-mask::${{ secrets.X }}"
    nvidia_tree.write_releases(nvidia.root, feed)
    tasks.propose_drivers(MockContext(), **_options(nvidia, repo / "versions.toml"))
    out = capsys.readouterr().out
    for line in out.splitlines():
        assert not line.strip().startswith("::"), line
        assert "\x1b" not in line
    body = (tmp_path / "gh.log").read_text()
    assert "\n::" not in body
    assert "\\n::error" in body or "\\n::add-mask" in body


def test_a_branch_newer_in_versions_toml_than_nvidia_lists_is_not_called_the_newest() -> None:
    driver = next(d for d in TODAY.drivers if d.branch == "595")
    older = "595.1.1"
    listed = {"595": propose.Release("595", "production branch", older, "", "")}
    _, notes = propose.find_candidates({"595": driver}, listed)
    said = f"595: NVIDIA lists only {older}, older than {driver.version} in versions.toml"
    assert notes == [f"{said}; {driver.version} stays"]


def test_a_stale_branch_of_a_failed_run_is_replaced_and_the_hint_names_the_setting(
    nvidia: ReleaseServer, repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    behind = repo / "versions.toml"
    branch = f"record-driver/{LTS.version}"
    gh = tmp_path / "bin" / "gh"
    working = gh.read_text()
    gh.write_text(working.replace('"pr create") echo', '"pr create") exit 1; echo'))
    with pytest.raises(Exit, match="1 of 3 drivers"):
        tasks.propose_drivers(MockContext(), **_options(nvidia, behind))
    out = capsys.readouterr().out
    assert "Allow GitHub Actions to create and approve pull requests" in out
    assert pull_requests.git(tmp_path / "origin.git", "branch", "--list", branch).strip() == branch
    # The stale branch is pushed over on the next run, which opens the pull request.
    pull_requests.git(repo, "commit", "-q", "--allow-empty", "-m", "main moves on")
    pull_requests.git(repo, "push", "-q", "origin", "main")
    gh.write_text(working)
    tasks.propose_drivers(MockContext(), **_options(nvidia, behind))
    assert f"{LTS.version}: opened https://github.com/o/gpu-driver-container/pull/7" in (
        capsys.readouterr().out)  # fmt: skip
