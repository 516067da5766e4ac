"""``invoke propose-peers``: the cluster session's peers (tests/integration/cluster/peers.toml) at
their newest releases, each as a pull request whose CI runs the scenarios against it.

1. A peer's releases are the tags of its git repository (``git ls-remote --tags``, the
   repository named by its module path). The newest final release counts; a pre-release only
   when the pin is a pre-release itself: then a newer pre-release of its line counts too.
2. The Go module proxy is asked for it (``go list -m -json``). A tag that is a valid version of
   the module is pinned as itself; one that is not (the GPU Operator's v26.7.0: its module path
   has no /v26; kured's tags have no leading v) as its commit's pseudo-version, with the tag
   beside it. k8s.io/kubernetes's staging modules and its stamped version follow the tag.
3. A version the proxy serves is a bump: the peer's table in peers.toml is rewritten as text
   (everything else, comments included, is kept), ``peers.py lock <name>`` locks it, and it is
   committed on ``bump-peer/<name>-<tag>`` and opened as a pull request (gdc.propose's
   Repository: once; a failed run's branch is pushed over). The peer's ``unserved`` table goes:
   its newest release is served. A version the proxy refuses is a note with its answer; the peer
   stays, and when ``unserved`` does not name the tag yet, adding it is a pull request of its
   own (``unserved-peer/<name>-<tag>``). ``--dry-run`` prints each change and does nothing.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from gdc import commands
from gdc.nvidia import RecordError
from gdc.propose import Repository, diff, proposed
from gdc.versions_text import tables
from nvidia_driver.atomic import write_atomically

Say = Callable[[str], None]
PEERS_FILE = Path("tests") / "integration" / "cluster" / "peers.toml"
UNSERVED = "unserved"
# Module paths whose repository is not the path itself.
REPOSITORIES = {"k8s.io/kubernetes": "https://github.com/kubernetes/kubernetes"}
STAGING_PROBE = "k8s.io/client-go"  # one of k8s.io/kubernetes's published staging modules
_TAG = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z][0-9A-Za-z.-]*))?")
_MODULE_VERSION = re.compile(r"v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?")


class PeerError(Exception):
    """A peer whose releases or versions could not be read, or whose pin could not be edited."""


@dataclass(frozen=True)
class Pin:
    """A peer's table in peers.toml."""

    name: str
    module: str
    version: str  # the module version
    tag: str  # the release it is ("": the version is the tag)
    staging: str  # k8s.io/kubernetes only

    @property
    def release(self) -> str:
        return self.tag or self.version

    @property
    def repository(self) -> str:
        if self.module in REPOSITORIES:
            return REPOSITORIES[self.module]
        parts = self.module.split("/")
        if parts[0] != "github.com" or len(parts) < 3:  # noqa: PLR2004 - host, owner, name
            raise PeerError(f"{self.module}: only github.com modules name their repository")
        return "https://" + "/".join(parts[:3])


class Release(NamedTuple):
    tag: str
    commit: str


@dataclass(frozen=True)
class Proposal:
    pin: Pin
    release: Release
    branch: str
    title: str
    why: str  # the pull request's first paragraph
    text: str  # peers.toml with the change
    diff: str
    lock: bool  # a new version: peers.py lock <name> runs before the commit


def load(text: str) -> list[Pin]:
    """The peers (peers.toml's tables but ``unserved``), in file order."""
    tables = tomllib.loads(text)
    return [
        Pin(name, table["module"], table["version"], table.get("tag", ""), table.get("staging", ""))
        for name, table in tables.items()
        if name != UNSERVED
    ]


# (major, minor, patch, 1 for a final release, the pre-release's identifiers)
Key = tuple[int, int, int, int, tuple[tuple[tuple[int, int, str], ...], ...]]


def release_key(tag: str) -> Key | None:
    """The tag's place in version order (v optional); None for a tag that is no release. A
    pre-release's identifiers compare by their runs of digits and letters (rc10 after rc2)."""
    match = _TAG.fullmatch(tag)
    if match is None:
        return None
    major, minor, patch = (int(part) for part in match.group(1, 2, 3))
    if match[4] is None:
        return major, minor, patch, 1, ()
    identifiers = tuple(
        tuple(
            (0, int(run), "") if run.isdigit() else (1, 0, run)
            for run in re.findall(r"\d+|\D+", identifier)
        )
        for identifier in match[4].split(".")
    )
    return major, minor, patch, 0, identifiers


def is_module_version(module: str, tag: str) -> bool:
    """Whether go can pin the tag as itself: semver with a v, and the major version the module
    path allows (v0 or v1, or N with a /vN suffix)."""
    match = _MODULE_VERSION.fullmatch(tag)
    if match is None:
        return False
    suffix = re.search(r"/v(\d+)$", module)
    allowed = int(suffix[1]) if suffix else 1
    return int(match[1]) == allowed or (allowed == 1 and match[1] == "0")


def tags(ls_remote: str) -> dict[str, str]:
    """``git ls-remote --tags``'s answer: each tag's commit (an annotated tag's peeled one)."""
    found: dict[str, str] = {}
    for line in ls_remote.splitlines():
        commit, _, ref = line.partition("\t")
        if not ref.startswith("refs/tags/"):
            continue
        name = ref.removeprefix("refs/tags/")
        if name.endswith("^{}"):
            found[name.removesuffix("^{}")] = commit
        else:
            found.setdefault(name, commit)
    return found


def newest(pin: Pin, released: Mapping[str, str]) -> Release | None:
    """The newest release newer than the pin: a final one, or a pre-release of the pin's line
    when the pin is a pre-release. None when there is none."""
    current = release_key(pin.release)
    if current is None:
        raise PeerError(f"{pin.release} (peers.toml) is not a release version")
    line = current[:3] if not current[3] else None
    found: list[tuple[Key, Release]] = []
    for tag, commit in released.items():
        key = release_key(tag)
        if key is None or key <= current:
            continue
        if key[3] or key[:3] == line:
            found.append((key, Release(tag, commit)))
    return max(found, key=lambda pair: pair[0])[1] if found else None


# --- peers.toml as text ------------------------------------------------------------------------


def _table(text: str, table: str) -> tuple[list[str], int, int] | None:
    """text's lines, and where the table is among them (gdc.versions_text.tables); None when
    text has no such table."""
    lines = text.splitlines(keepends=True)
    for key, start, end in tables(lines):
        if ".".join(part.strip() for part in key.split(".")) == table:
            return lines, start, end
    return None


def _edited(text: str, table: str) -> tuple[list[str], int, int]:
    found = _table(text, table)
    if found is None:
        raise PeerError(f"peers.toml has no table [{table}]")
    return found


def _quote(value: str) -> str:
    return json.dumps(value)  # a TOML basic string, for the ASCII of versions and tags


def set_values(text: str, table: str, values: Mapping[str, str]) -> str:
    """text with the table's one-line ``key = "..."`` values set; a missing key is added before
    the table's ``version`` (tag) or after its last line."""
    lines, start, end = _edited(text, table)
    for key, value in values.items():
        line = f"{key} = {_quote(value)}\n"
        at = next((n for n in range(start + 1, end)
                   if re.match(rf"{re.escape(key)}\s*=", lines[n])), None)  # fmt: skip
        if at is not None:
            lines[at] = line
            continue
        before = next((n for n in range(start + 1, end) if re.match(r"version\s*=", lines[n])), end)
        lines.insert(before, line)
        end += 1
    return "".join(lines)


def stamp_version(text: str, table: str, tag: str) -> str:
    """The table's ldflags stamped with tag (gitVersion, gitMajor, gitMinor), as Kubernetes'
    release build stamps them."""
    lines, start, end = _edited(text, table)
    major, minor = tag.removeprefix("v").split(".")[:2]
    body = "".join(lines[start:end])
    for name, value in (("gitVersion", tag), ("gitMajor", major), ("gitMinor", minor)):
        body = re.sub(rf"(version\.{name}=)[^\s\\\"]+", rf"\g<1>{value}", body)
    return "".join(lines[:start]) + body + "".join(lines[end:])


def drop_table(text: str, table: str) -> str:
    """text without the table (and the blank lines after it); the same text when it has none."""
    found = _table(text, table)
    if found is None:
        return text
    lines, start, end = found
    while end < len(lines) and not lines[end].strip():
        end += 1
    if end == len(lines):  # the last table: the blank lines before it go instead
        while start > 0 and not lines[start - 1].strip():
            start -= 1
    return "".join(lines[:start] + lines[end:])


def named(tag: str, entries: list[str]) -> bool:
    return any(re.search(rf"(?<![\w.]){re.escape(tag)}(?![\w.])", entry) for entry in entries)


def with_unserved(text: str, pin: Pin, tag: str) -> str:
    """text whose ``unserved`` table names tag first among the peer's; the same text when it
    does already."""
    table = f"{UNSERVED}.{pin.name}"
    listed = tomllib.loads(text).get(UNSERVED, {}).get(pin.name)
    if listed is None:
        entry = (f"\n[{table}]\nmodule = {_quote(pin.module)}\ntags = [{_quote(tag)}]\n"
                 f"reason = {_quote(f'{pin.name} stays at {pin.release}')}\n")  # fmt: skip
        return text.rstrip("\n") + "\n" + entry
    entries = list(listed.get("tags", []))
    if named(tag, entries):
        return text
    return _set_list(text, table, "tags", [tag, *entries])


def _set_list(text: str, table: str, key: str, values: list[str]) -> str:
    lines, start, end = _edited(text, table)
    line = f"{key} = [{', '.join(_quote(value) for value in values)}]\n"
    at = next((n for n in range(start + 1, end) if re.match(rf"{key}\s*=", lines[n])), None)
    if at is None or not lines[at].rstrip().endswith("]"):
        raise PeerError(f"peers.toml's [{table}] {key} is not a one-line list: edit it by hand")
    lines[at] = line
    return "".join(lines)


def bumped(text: str, pin: Pin, release: Release, version: str) -> str:
    """peers.toml with the peer at the release: version, tag (when it is not the version),
    staging and stamped version (k8s.io/kubernetes); its ``unserved`` table dropped."""
    values = {"version": version}
    if pin.tag or release.tag != version:
        values["tag"] = release.tag
    if pin.staging:
        values["staging"] = staging(release.tag)
    text = set_values(text, pin.name, values)
    if pin.staging:
        text = stamp_version(text, pin.name, release.tag)
    return drop_table(text, f"{UNSERVED}.{pin.name}")


def staging(tag: str) -> str:
    """k8s.io/kubernetes v1.X.Y's staging modules are published as v0.X.Y."""
    return "v0." + tag.split(".", 1)[1]


# --- upstream ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Upstream:
    """The peers' git repositories and the Go module proxy, through the command seam."""

    output: commands.Capture = commands.output

    def releases(self, pin: Pin) -> dict[str, str]:
        status, out = self.output(["git", "ls-remote", "--tags", pin.repository])
        if status != 0:
            raise PeerError(f"git ls-remote --tags {pin.repository} exited {status}")
        return tags(out)

    def version(self, module: str, ref: str) -> tuple[str, str]:
        """The module version the proxy serves ref at, or ("", its error)."""
        status, out = self.output(["go", "list", "-m", "-e", "-json", f"{module}@{ref}"])
        try:
            answer = json.loads(out) if status == 0 else None
        except json.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            raise PeerError(f"go list -m -json {module}@{ref} exited {status}: is Go installed?")
        error = answer.get("Error")
        if error:  # go's words on one line: none of its own lines reaches a log raw
            return "", " ".join(str(error.get("Err", error) if isinstance(error, dict)
                                    else error).split())  # fmt: skip
        return str(answer.get("Version", "")), ""


@dataclass
class PeerProposer:
    path: Path  # peers.toml
    say: Say = print
    repository: Repository | None = None  # None: a dry run
    upstream: Upstream = field(default_factory=Upstream)
    run: commands.Runner = commands.run  # peers.py lock
    opened: list[str] = field(default_factory=list)

    def propose(self) -> list[Proposal]:
        base = self.repository.base() if self.repository is not None else ""
        text = self.path.read_text()
        proposals, failed, pins = [], 0, load(text)
        for pin in pins:
            try:
                proposal = self._proposal(pin, text)
                if proposal is not None:
                    proposals.append(proposal)
                    self._deliver(proposal, base)
            except (PeerError, RecordError) as exc:
                self.say(f"{pin.name}: {exc}")
                failed += 1
        if failed:
            raise PeerError(f"{failed} of {len(pins)} peers were not checked or proposed (see "
                            "above); the others were")  # fmt: skip
        return proposals

    def _proposal(self, pin: Pin, text: str) -> Proposal | None:
        release = newest(pin, self.upstream.releases(pin))
        if release is None:
            self.say(f"{pin.name}: {pin.release} is the newest release of {pin.repository}")
            return None
        ref = release.tag if is_module_version(pin.module, release.tag) else release.commit
        version, error = self.upstream.version(pin.module, ref)
        if not error and pin.staging:
            _, error = self.upstream.version(STAGING_PROBE, staging(release.tag))
        if error:
            self.say(f"{pin.name}: {release.tag} is newer than {pin.release}, but the Go module "
                     f"proxy refuses it: {error}; {pin.name} stays at {pin.release}")  # fmt: skip
            after = with_unserved(text, pin, release.tag)
            if after == text:
                return None
            return Proposal(pin, release, f"unserved-peer/{pin.name}-{release.tag}",
                            f"peers.toml: {pin.name} {release.tag} is not served by the Go "
                            "module proxy", f"The Go module proxy refuses {pin.name} "
                            f"{release.tag} ({pin.module}@{ref}): `{error}`. peers.toml's "
                            f"`{UNSERVED}` table names it; {pin.name} stays at {pin.release}.",
                            after, diff(text, after, self.path.name), lock=False)  # fmt: skip
        if ref != release.tag:
            self.say(f"{pin.name}: {release.tag} is not a version of {pin.module}: its commit "
                     f"{release.commit[:12]} is {version}")  # fmt: skip
        after = bumped(text, pin, release, version)
        self.say(f"{pin.name}: {release.tag} ({version}) replaces {pin.release}")
        return Proposal(pin, release, f"bump-peer/{pin.name}-{release.tag}",
                        f"peers.toml: {pin.name} {release.tag} replaces {pin.release}",
                        f"{pin.repository} tagged {release.tag} ({release.commit}), newer than "
                        f"{pin.release} in peers.toml; the Go module proxy serves it as "
                        f"{pin.module} {version}.", after, diff(text, after, self.path.name),
                        lock=True)  # fmt: skip

    def _deliver(self, proposal: Proposal, base: str) -> None:
        name, tag = proposal.pin.name, proposal.release.tag
        if self.repository is None:
            self.say(proposal.diff)
            then = "no lock, " if proposal.lock else ""
            self.say(f"{name}: {tag}: dry run: {then}no branch, no pull request")
            return
        url = self.repository.propose(proposal.branch, base, title=proposal.title,
                                      message=proposal.why, body=self._body(proposal),
                                      change=lambda: self._change(proposal))  # fmt: skip
        proposed(url, f"{name}: {tag}", proposal.branch, self.say, self.opened)

    def _change(self, proposal: Proposal) -> list[Path]:
        write_atomically(self.path, proposal.text, self.path.stat().st_mode & 0o777)
        if not proposal.lock:
            return [self.path]
        script = self.path.parent / "peers.py"
        status = self.run([sys.executable, str(script), "lock", proposal.pin.name])
        if status != 0:
            raise PeerError(f"peers.py lock {proposal.pin.name} exited {status}")
        return [self.path, self.path.parent / "peers" / proposal.pin.name]

    def _body(self, proposal: Proposal) -> str:
        run = (
            f"`invoke propose-peers` rewrote the peer's table and locked it (`python "
            f"{PEERS_FILE.parent}/peers.py lock {proposal.pin.name}`: go.mod and go.sum). This "
            "pull request's CI runs the cluster scenarios (`nox -s cluster`) against it."
            if proposal.lock
            else "`invoke propose-peers` names it in peers.toml; the nightly tries it again."
        )
        return f"{proposal.why}\n\n{run}\n\n```diff\n{proposal.diff}\n```\n"
