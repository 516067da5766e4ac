"""``invoke propose-drivers``: what NVIDIA published since versions.toml was written, as pull
requests made by ``invoke record-driver``.

1. NVIDIA's list of datacenter driver releases (``releases.json``, gdc.nvidia) gives each
   branch's newest release.
2. A branch versions.toml tracks (it keeps one driver per branch: "the newest release of each
   active datacenter branch") whose newest release is newer than the one listed gets a
   proposal: the new release's entry, recorded from NVIDIA's files (gdc.record), replacing the
   branch's old one. A tracked driver whose entry still has "TODO" values is recorded again:
   when NVIDIA's files now give some of them (NVLSM's, say), that is a proposal too. Branches
   NVIDIA lists that versions.toml does not track are only named.
3. Each proposal is recorded into a scratch copy of versions.toml. ``--dry-run`` prints the
   change; otherwise it is committed on a branch of its own (``record-driver/<version>``, or
   ``record-driver/<version>-<digest of the new values>`` for a filled entry), pushed, and
   opened as a pull request with ``gh``. A change is proposed once: when a pull request from
   its branch exists (open, merged or closed), it is not proposed again. A branch without one
   is a failed run's (its push went through, its pull request did not): it is pushed over.
4. A proposal that replaces the driver whose build image the reboot gate's manifests run also
   moves them (GATE_IMAGE_FILES) to the new driver's, in the same commit: the unit tests
   (tests/unit/gate/test_manifests.py) fail while they name a driver versions.toml does not list.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import shutil
import tempfile
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gdc import commands
from gdc import record as recording
from gdc.nvidia import (
    MAX_RELEASES_BYTES,
    Nvidia,
    NvidiaUpstream,
    RecordError,
    Release,
    newest_releases,
)
from gdc.tags import build_image_tags
from gdc.versions import Driver, VersionsError, load_versions
from nvidia_driver.atomic import write_atomically
from nvidia_driver.naming import driver_key

Say = Callable[[str], None]
BOT = ("github-actions[bot]", "41898282+github-actions[bot]@users.noreply.github.com")
# gh pr create fails, after a push that worked, most likely for the repository setting (GitHub
# docs, "Managing GitHub Actions settings for a repository": off by default).
PR_CREATE_HINT = (
    'if the token is GITHUB_TOKEN, turn on the repository setting "Allow GitHub Actions to '
    'create and approve pull requests" (Settings > Actions > General); the branch stays '
    "pushed and the next run pushes over it"
)
SECOND_SOURCES = (
    "nixpkgs pkgs/os-specific/linux/nvidia-x11/default.nix (the .run files), the AUR "
    "PKGBUILDs nvidia-fabricmanager, libnvidia-nscq, nvlsm and libnvsdm (the redist archives)"
)
# Where the reboot gate's manifests name its image, beside versions.toml (kustomize's newTag:
# and the workloads' image: lines; tests/unit/gate/test_manifests.py checks the list is whole).
GATE_IMAGE_FILES = tuple(
    Path("deploy", "reboot-gate", name)
    for name in ("fluo/kustomization.yaml", "fluo/0500_daemonset.yaml", "fluo/0600_deployment.yaml",
                 "kured/kustomization.yaml", "kured/0500_daemonset.yaml")
)  # fmt: skip


def moved_gate_image(text: str, old: str, new: str) -> str:
    """text with its newTag: and image: lines that name tag old naming tag new instead."""
    line = rf'^(\s*(?:newTag: |image: "?[^\s"]+:)){re.escape(old)}("?)$'
    return re.sub(line, rf"\g<1>{new}\g<2>", text, flags=re.MULTILINE)


@dataclass(frozen=True)
class Candidate:
    """A driver to record: a tracked branch's newer release, or a tracked entry with TODOs."""

    tracked: str  # the branch's driver in versions.toml
    version: str  # the driver to record
    release: Release | None = None  # NVIDIA's newer release; None: fill tracked's TODOs

    def describe(self) -> str:
        branch = self.version.split(".", 1)[0]
        if self.release is None:
            return f"{branch}: {self.version} has TODO values: recording it again"
        kind = self.release.branch_type or "branch"
        date = f", released {self.release.date}" if self.release.date else ""
        return f"{branch}: {self.version} ({kind}{date}) replaces {self.tracked}"


def has_todo(driver: Driver) -> bool:
    return None in driver.sha256.values() or any(
        archive.version is None or None in archive.sha256.values() for archive in driver.redist
    )


def find_candidates(
    tracked: Mapping[str, Driver], newest: Mapping[str, Release]
) -> tuple[list[Candidate], list[str]]:
    """What to record for the tracked branches (branch -> driver), and a note per other one."""
    candidates, notes = [], []
    for branch, driver in sorted(tracked.items()):
        release = newest.get(branch)
        if release is not None and driver_key(release.version) > driver_key(driver.version):
            candidates.append(Candidate(driver.version, release.version, release))
            continue
        if release is None:
            notes.append(f"{branch}: NVIDIA's list has no branch {branch}; {driver.version} stays")
        elif release.version != driver.version:
            notes.append(f"{branch}: NVIDIA lists only {release.version}, older than "
                         f"{driver.version} in versions.toml; {driver.version} stays")  # fmt: skip
        else:
            notes.append(f"{branch}: {driver.version} is the newest release NVIDIA lists")
        if has_todo(driver):
            candidates.append(Candidate(driver.version, driver.version))
    for branch, release in sorted(newest.items()):
        if branch not in tracked:
            kind = release.branch_type or "branch"
            notes.append(
                f"{branch} ({kind}, {release.version}) is not tracked in versions.toml: "
                f"`invoke record-driver {release.version}` adds it"
            )
    return candidates, notes


@dataclass(frozen=True)
class Proposal:
    """A candidate recorded: the new versions.toml (and gate manifests), and where it goes."""

    candidate: Candidate
    record: recording.Record
    files: Mapping[Path, str]  # versions.toml with the record's entry, then the gate's moved
    diff: str
    gate: str = ""  # the build image the gate's manifests move to; "": they stay

    @property
    def branch(self) -> str:
        if self.candidate.release is not None:
            return f"record-driver/{self.record.version}"
        values = tomllib.loads(self.record.entry())
        digest = hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()
        return f"record-driver/{self.record.version}-{digest[:8]}"

    @property
    def title(self) -> str:
        version = self.record.version
        if self.candidate.release is not None:
            return f"versions.toml: driver {version} replaces {self.candidate.tracked}"
        return f"versions.toml: driver {version}'s TODO values, from NVIDIA's files"


def diff(before: str, after: str, name: str) -> str:
    """The change from before to after of file name, as a unified diff."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{name}", f"b/{name}"
    )
    return "".join(lines).rstrip("\n")


@dataclass(frozen=True)
class Repository:
    """git (in the versions file's repository) and gh, through the tooling's command seam."""

    root: Path
    task: str = "propose-drivers"  # what the messages call the task that proposes
    run: commands.Runner = commands.run
    output: commands.Capture = commands.output

    @classmethod
    def of(cls, path: Path, task: str = "propose-drivers") -> Repository:
        """The git work tree that holds path."""
        status, out = commands.output(
            ["git", "-C", str(path.parent), "rev-parse", "--show-toplevel"]
        )
        if status != 0 or not out.strip():
            raise RecordError(f"{path} is not in a git work tree: {task} commits to it")
        return cls(Path(out.strip()).resolve(), task)

    def base(self) -> str:
        """The branch checked out, which pull requests go to; refused with local changes."""
        if self.git_output("status", "--porcelain"):
            raise RecordError(
                f"{self.root} has uncommitted changes: {self.task} commits on branches of its "
                "own; commit or stash them first"
            )
        base = self.git_output("rev-parse", "--abbrev-ref", "HEAD")
        if base == "HEAD":
            raise RecordError(
                f"{self.root} is not on a branch: check out the branch the pull requests should "
                "go to (main)"
            )
        return base

    def git(self, *args: str) -> None:
        status = self.run(["git", "-C", str(self.root), *args])
        if status != 0:
            raise RecordError(f"git {' '.join(args)} exited {status}")

    def git_output(self, *args: str) -> str:
        status, out = self.output(["git", "-C", str(self.root), *args])
        if status != 0:
            raise RecordError(f"git {' '.join(args)} exited {status}")
        return out.strip()

    def gh(self, *args: str, hint: str = "") -> str:
        status, out = self.output(["gh", *args])
        if status != 0:
            raise RecordError(
                f"gh {' '.join(args[:2])} exited {status}: "
                + (hint or "is gh installed and GH_TOKEN set (a token that may push and open "
                   "pull requests)?")
            )  # fmt: skip
        return out.strip()

    def propose(
        self,
        branch: str,
        base: str,
        *,
        title: str,
        message: str,
        body: str,
        change: Callable[[], Sequence[Path]],
    ) -> str | None:
        """change() (it writes the files it returns) committed on branch, pushed, and opened as a
        pull request to base: its URL. None, and nothing done, when a pull request from branch
        exists (open, merged or closed). The work tree is left on base as it was, also on
        failure."""
        found = self.gh(
            "pr", "list", "--head", branch, "--state", "all", "--json", "number", "--jq", "length"
        )
        if found not in {"", "0"}:
            return None
        self.git("switch", "--quiet", "--create", branch)
        try:
            changed = change()
            self.git("add", "--", *(str(path.resolve().relative_to(self.root)) for path in changed))
            self.git("-c", f"user.name={BOT[0]}", "-c", f"user.email={BOT[1]}", "commit",
                     "--quiet", "--message", title, "--message", message)  # fmt: skip
            # gh lends git its token for this one push, as `gh auth setup-git` would, without
            # writing it into any git config.
            # --force: no pull request comes from the branch (checked above), so one there is a
            # failed run's, and this run's commit replaces it.
            self.git("-c", "credential.helper=",
                     "-c", "credential.helper=!gh auth git-credential",
                     "push", "--quiet", "--force", "origin",
                     f"{branch}:refs/heads/{branch}")  # fmt: skip
            return self.gh("pr", "create", "--base", base, "--head", branch, "--title", title,
                           "--body", body, hint=PR_CREATE_HINT)  # fmt: skip
        finally:
            self.git("switch", "--discard-changes", "--quiet", base)
            self.git("branch", "--quiet", "-D", branch)


def proposed(url: str | None, who: str, branch: str, say: Say, opened: list[str]) -> None:
    """What Repository.propose did: opened a pull request (its URL kept), or found one."""
    if url is None:
        say(f"{who}: already proposed (a pull request from {branch} exists)")
        return
    opened.append(url)
    say(f"{who}: opened {url}")


@dataclass
class Proposer:
    path: Path  # versions.toml
    upstream: NvidiaUpstream
    env: Mapping[str, str]
    date: str
    say: Say = print
    repository: Repository | None = None  # None: a dry run
    opened: list[str] = field(default_factory=list)
    _base: str = field(default="", init=False)  # the branch the pull requests go to

    def run(self) -> list[Proposal]:
        if self.repository is not None:
            self._base = self.repository.base()  # before any request
        nvidia = Nvidia(self.env)
        url = self.upstream.releases_list_url()
        feed = nvidia.json(url, MAX_RELEASES_BYTES, "NVIDIA's list of driver releases")
        try:
            tracked = {driver.branch: driver for driver in load_versions(self.path).drivers}
        except VersionsError as exc:
            raise RecordError(str(exc)) from None
        candidates, notes = find_candidates(tracked, newest_releases(feed, url))
        for note in notes:
            self.say(note)
        proposals, failed = [], 0
        for candidate in candidates:
            self.say(candidate.describe())
            try:
                proposal = self._propose(candidate)
            except RecordError as exc:
                self.say(f"{candidate.version}: {exc}")
                failed += 1
                continue
            if proposal is not None:
                proposals.append(proposal)
        if failed:
            raise RecordError(
                f"{failed} of {len(candidates)} drivers were not recorded or proposed (see "
                "above); the others were"
            )
        return proposals

    def _propose(self, candidate: Candidate) -> Proposal | None:
        proposal = self._record(candidate)
        # A newer release NVIDIA lists before its redist archives are all out: merged, it would
        # replace a driver that builds with one that does not.
        missing = proposal.record.missing_required() if proposal and candidate.release else []
        if missing:
            self.say(f"{candidate.version}: not proposed yet: redistrib_{candidate.version}.json "
                     f"lists no {', '.join(missing)}, without which invoke build refuses the "
                     f"driver; {candidate.tracked} stays, the next run tries again")  # fmt: skip
            return None
        if proposal is None:
            self.say(f"{candidate.version}: NVIDIA's files give nothing versions.toml lacks")
        elif self.repository is None:
            self.say(proposal.diff)
            self.say(
                f"{candidate.version}: {proposal.record.summary()} (dry run: no branch, "
                "no pull request)"
            )
        else:
            self._pull_request(proposal, self.repository, self._base)
        return proposal

    def _record(self, candidate: Candidate) -> Proposal | None:
        """The candidate recorded into a scratch copy; None when no value changed."""
        before = self.path.read_text()
        with tempfile.TemporaryDirectory(prefix="propose-drivers.") as scratch:
            copy = Path(scratch) / self.path.name
            shutil.copyfile(self.path, copy)
            record, _ = recording.record_driver(
                candidate.version, copy, self.upstream, verify=False, date=self.date, env=self.env
            )
            after = copy.read_text()
        if tomllib.loads(after) == tomllib.loads(before):
            return None
        files, diffs = {self.path: after}, [diff(before, after, self.path.name)]
        old, new = (build_image_tags(v, ())[0] for v in (candidate.tracked, candidate.version))
        for name in GATE_IMAGE_FILES:
            path = self.path.parent / name
            text = path.read_text() if path.is_file() else ""  # a versions.toml elsewhere
            if (moved := moved_gate_image(text, old, new)) != text:
                files[path] = moved
                diffs.append(diff(text, moved, name.as_posix()))
        return Proposal(candidate, record, files, "\n".join(diffs), new if len(files) > 1 else "")

    def _pull_request(self, proposal: Proposal, repository: Repository, base: str) -> None:
        def change() -> list[Path]:
            for path, text in proposal.files.items():
                write_atomically(path, text, path.stat().st_mode & 0o777)
            return list(proposal.files)

        message = proposal.record.summary()
        if proposal.gate:
            message += f"\n\nThe reboot gate's manifests run {proposal.gate} now."
        url = repository.propose(proposal.branch, base, title=proposal.title, message=message,
                                 body=self._body(proposal), change=change)  # fmt: skip
        proposed(url, proposal.record.version, proposal.branch, self.say, self.opened)

    def _body(self, proposal: Proposal) -> str:
        record, release = proposal.record, proposal.candidate.release
        if release is None:
            why = (
                f"versions.toml leaves values of {record.version} TODO that NVIDIA's files now "
                "give."
            )
        else:
            date = f", released {release.date}" if release.date else ""
            listed = self.upstream.releases_list_url()
            why = (
                f"NVIDIA's list of datacenter driver releases ({listed}) has "
                f"{release.version} ({release.branch_type or 'branch'}{date}), newer than "
                f"{proposal.candidate.tracked} in versions.toml."
            )
            if release.notes:
                why += f" Release notes: {release.notes}"
        if proposal.gate:
            tracked = proposal.candidate.tracked
            why += (
                f"\n\nThe reboot gate's manifests ran the build image of {tracked}, "
                f"which this replaces: their `newTag:` and `image:` lines name `{proposal.gate}` "
                "now (tests/unit/gate/test_manifests.py wants a driver versions.toml lists)."
            )
        sources = "\n".join(f"- `{checksum.source}`" for checksum in record.checksums)
        return (
            f"{why}\n\n`invoke propose-drivers` recorded the entry with `invoke record-driver "
            f"{record.version}` from NVIDIA's own files:\n\n{sources}\n- `{record.manifest}`\n\n"
            f"{record.summary()}\n\nBefore merging, check the values against a second source "
            f"where one has the same files ({SECOND_SOURCES}). Once merged, the nightly "
            f"`invoke publish` builds and pushes the images of {record.version}.\n\n"
            f"```diff\n{proposal.diff}\n```\n"
        )
