"""invoke record-driver against NVIDIA's download tree on 127.0.0.1 (tests/unit/nvidia_tree.py)."""

from __future__ import annotations

import hashlib
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import nvidia_tree
import pytest
import tasks
from fetch_server import ReleaseServer
from invoke.context import MockContext
from invoke.exceptions import Exit
from raw_server import raw_server

from gdc import record as recording
from gdc import versions_text
from gdc.nvidia import Nvidia, RecordError, parse_checksum_file
from gdc.versions import Driver, load_versions

TODAY_TEXT, TODAY, todo_entry = nvidia_tree.TODAY_TEXT, nvidia_tree.TODAY, nvidia_tree.todo_entry
DATE = "2026-12-05"
NVLSM, STAND_IN = nvidia_tree.NVLSM_AUR, nvidia_tree.STAND_IN


def with_placeholder(driver: Driver, placeholder: str) -> str:
    """Today's versions.toml with driver's entry replaced by an older, unrecorded release."""
    return versions_text.put_entry(TODAY_TEXT, todo_entry(placeholder), placeholder, driver.version)


@pytest.fixture
def nvidia(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ReleaseServer]:
    """NVIDIA's files for every driver versions.toml records, trusted on 127.0.0.1."""
    root = tmp_path / "nvidia"
    for driver in TODAY.drivers:
        nvidia_tree.lay_out(root, driver)
    for name, value in nvidia_tree.TRUST_LOOPBACK.items():
        monkeypatch.setenv(name, value)
    with ReleaseServer(root) as server:
        yield server


def _record(server: ReleaseServer, path: Path, version: str, **options: object) -> str:
    upstream = nvidia_tree.upstream(server)
    tasks.record_driver(
        MockContext(),
        version,
        versions_file=str(path),
        checksum_base_url=upstream.checksum_base_url,
        driver_base_url=upstream.driver_base_url,
        fabricmanager_base_url=upstream.redist_base_url,
        **options,
    )  # type: ignore[arg-type]
    return path.read_text()


def _refused(server: ReleaseServer, path: Path, version: str) -> str:
    before = path.read_bytes()
    with pytest.raises(Exit) as refused:
        _record(server, path, version)
    assert path.read_bytes() == before, "nothing is written"
    assert refused.value.code == 1
    message = str(refused.value.message)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("driver", TODAY.drivers, ids=[d.version for d in TODAY.drivers])
def test_each_driver_s_entry_is_recorded_as_versions_toml_has_it_today(
    nvidia: ReleaseServer, tmp_path: Path, driver: Driver, capsys: pytest.CaptureFixture[str]
) -> None:
    """From an older, unrecorded release of the branch to today's entry, values for values."""
    path = tmp_path / "versions.toml"
    placeholder = f"{driver.branch}.0.1"
    path.write_text(with_placeholder(driver, placeholder))
    written = _record(nvidia, path, driver.version)
    assert tomllib.loads(written) == tomllib.loads(TODAY_TEXT)
    header = TODAY_TEXT[: TODAY_TEXT.index("[drivers.")]
    assert written.startswith(header), "the comments and other tables are kept as they were"
    line = capsys.readouterr().out.strip()
    assert line.startswith(
        f'invoke record-driver: wrote {path} [drivers."{driver.version}"] '
        f"(replaces {placeholder}): .run amd64, arm64; redist "
    )
    version = driver.version
    checksum_url = nvidia.url(
        f"XFree86/Linux-x86_64/{version}/NVIDIA-Linux-x86_64-{version}.run.sha256sum"
    )
    assert f'sha256.amd64 = "{driver.sha256["amd64"]}"  # {checksum_url}\n' in written
    assert f"# {nvidia.url('compute/nvidia-driver/redist')}/redistrib_{version}.json\n" in written
    assert (f'fabricmanager = {{ version = "{version}", amd64 = "') in written
    assert (
        'nvlsm = { version = "TODO", amd64 = "TODO", arm64 = "TODO" }  # not in '
        f"redistrib_{version}.json: `invoke record-driver {version}` fills it once NVIDIA "
        "lists it\n"
    ) in written


def test_re_recording_a_driver_cross_checks_its_values(
    nvidia: ReleaseServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "versions.toml"
    path.write_text(TODAY_TEXT)
    newest = TODAY.newest.version
    written = _record(nvidia, path, newest)
    assert tomllib.loads(written) == tomllib.loads(TODAY_TEXT)
    assert f'[drivers."{newest}"] (re-recorded)' in capsys.readouterr().out
    nvidia_tree.write_checksum(
        nvidia.root,
        newest,
        "arm64",
        nvidia_tree.sha256sum_line("0" * 64, nvidia_tree.run_name(newest, "arm64")),
    )
    assert _refused(nvidia, path, newest) == (
        f'invoke record-driver: versions.toml [drivers."{newest}"] records '
        f"{TODAY.newest.sha256['arm64']} for NVIDIA-Linux-aarch64-{newest}.run, but "
        f"{nvidia.url(f'XFree86/Linux-aarch64/{newest}')}/NVIDIA-Linux-aarch64-{newest}.run"
        f".sha256sum says {'0' * 64}: check both sources; nothing was written"
    )


# --- the refusals ------------------------------------------------------------------------------


def test_a_manifest_whose_versions_disagree_is_refused(
    nvidia: ReleaseServer, tmp_path: Path
) -> None:
    driver = TODAY.drivers[0]
    manifest = nvidia_tree.manifest_of(driver)
    manifest["fabricmanager"]["version"] = "580.173.02"
    nvidia_tree.write_manifest(nvidia.root, driver.version, manifest)
    path = tmp_path / "versions.toml"
    path.write_text(TODAY_TEXT)
    assert _refused(nvidia, path, driver.version) == (
        f"invoke record-driver: redistrib_{driver.version}.json lists fabricmanager 580.173.02 "
        f"for driver {driver.version}: the fabric manager must carry the driver's version; the "
        "manifest's versions disagree, nothing was written"
    )


def test_an_archive_of_another_version_than_listed_is_refused(
    nvidia: ReleaseServer, tmp_path: Path
) -> None:
    driver = TODAY.drivers[0]
    manifest = nvidia_tree.manifest_of(driver)
    manifest["nvlsm"] = {
        "version": NVLSM[0],
        "linux-sbsa": {
            "relative_path": "nvlsm/linux-sbsa/nvlsm-linux-sbsa-2025.06.10-archive.tar.xz",
            "sha256": NVLSM[2],
        },
    }
    nvidia_tree.write_manifest(nvidia.root, driver.version, manifest)
    path = tmp_path / "versions.toml"
    path.write_text(TODAY_TEXT)
    assert _refused(nvidia, path, driver.version) == (
        f"invoke record-driver: redistrib_{driver.version}.json lists nvlsm 2025.06.11 but its "
        "linux-sbsa archive as 'nvlsm/linux-sbsa/nvlsm-linux-sbsa-2025.06.10-archive.tar.xz', "
        "not nvlsm/linux-sbsa/nvlsm-linux-sbsa-2025.06.11-archive.tar.xz: the manifest's "
        "versions disagree; nothing was written"
    )


def test_a_checksum_file_that_names_another_file_is_refused(
    nvidia: ReleaseServer, tmp_path: Path
) -> None:
    driver = TODAY.drivers[0]
    other = "NVIDIA-Linux-x86_64-580.173.02.run"
    checksum = nvidia_tree.write_checksum(
        nvidia.root, driver.version, "amd64", nvidia_tree.sha256sum_line("ab" * 32, other)
    )
    path = tmp_path / "versions.toml"
    path.write_text(TODAY_TEXT)
    url = nvidia.url(str(checksum.relative_to(nvidia.root)))
    assert _refused(nvidia, path, driver.version) == (
        f"invoke record-driver: {url} names {other}, not NVIDIA-Linux-x86_64-"
        f"{driver.version}.run: refusing a checksum of another file"
    )


@pytest.mark.parametrize(
    "line",
    ["ab" * 31 + "  NAME", "ab" * 33 + "  NAME", "g" * 64 + "  NAME", "ab" * 32 + " NAME",
     "ab" * 32 + "  NAME\n" + "ab" * 32 + "  NAME", ""],
)  # fmt: skip
def test_a_checksum_line_s_digest_is_checked_by_the_one_sha256_validator(line: str) -> None:
    name = "NVIDIA-Linux-x86_64-610.57.04.run"
    text = line.replace("NAME", name)
    with pytest.raises(RecordError) as raised:
        parse_checksum_file(text, name, "https://host/x.sha256sum")
    assert str(raised.value) == (
        f"https://host/x.sha256sum is not one sha256sum line ('<64 hex digits>  {name}'): "
        f"{text[:120]!r}"
    )
    # As sha256sum writes it, in text or binary mode; upper case is read as lower.
    for mode in (" ", "*"):
        assert parse_checksum_file(f"{'AB' * 32} {mode}{name}\n", name, "u") == "ab" * 32


def test_a_host_that_is_not_nvidia_s_is_refused_before_any_request(
    nvidia: ReleaseServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NVIDIA_DRIVER_REDIRECT_HOSTS")
    path = tmp_path / "versions.toml"
    path.write_text(TODAY_TEXT)
    version = TODAY.drivers[0].version
    assert _refused(nvidia, path, version) == (
        f"invoke record-driver: refusing {nvidia.url('XFree86')}/Linux-x86_64/{version}/"
        f"NVIDIA-Linux-x86_64-{version}.run.sha256sum: 127.0.0.1 is not one of NVIDIA's hosts "
        "(download.nvidia.com, *.download.nvidia.com, docs.nvidia.com); for a mirror you "
        "trust, list its host in NVIDIA_DRIVER_REDIRECT_HOSTS"
    )
    assert not nvidia.requests


def test_a_redirect_to_a_foreign_host_is_refused(nvidia: ReleaseServer, tmp_path: Path) -> None:
    version = TODAY.drivers[0].version
    manifest = f"/compute/nvidia-driver/redist/redistrib_{version}.json"
    nvidia.redirects[manifest] = f"http://mirror.example{manifest}"
    path = tmp_path / "versions.toml"
    path.write_text(TODAY_TEXT)
    assert _refused(nvidia, path, version) == (
        f"invoke record-driver: refusing the redirect of {nvidia.url(manifest)} to "
        f"http://mirror.example{manifest}: mirror.example is not among the allowed hosts "
        "(127.0.0.1, 127.0.0.1); NVIDIA_DRIVER_REDIRECT_HOSTS lists the hosts redirects may "
        "go to"
    )


def test_arguments_are_checked_before_any_request(nvidia: ReleaseServer, tmp_path: Path) -> None:
    path = tmp_path / "versions.toml"
    path.write_text(TODAY_TEXT)
    assert _refused(nvidia, path, "580") == (
        "invoke record-driver: '580' is not an NVIDIA datacenter driver version such as 580.178.04"
    )
    assert "'580.178.04x' is not an NVIDIA" in _refused(nvidia, path, "580.178.04x")
    assert _refused(nvidia, path, "--help") == (
        "invoke record-driver: give the driver version first, e.g. invoke record-driver "
        "580.178.04 (its options: invoke --help record-driver)"
    )
    with pytest.raises(Exit, match="is not a file: give the versions file"):
        _record(nvidia, tmp_path / "missing.toml", TODAY.drivers[0].version)
    assert not nvidia.requests


def test_an_older_release_does_not_replace_a_branch_s_newer_one(
    nvidia: ReleaseServer, tmp_path: Path
) -> None:
    path = tmp_path / "versions.toml"
    path.write_text(TODAY_TEXT)
    newest = TODAY.newest
    older = f"{newest.branch}.0.1"
    nvidia_tree.stand_in_run(nvidia.root, older, "amd64")
    nvidia_tree.stand_in_run(nvidia.root, older, "arm64")
    nvidia_tree.write_manifest(nvidia.root, older, {"release_label": older})
    assert _refused(nvidia, path, older) == (
        f"invoke record-driver: {path} lists {newest.version}, newer than {older}: a branch's "
        "entry is only replaced by a newer release (versions.toml keeps each branch's newest)"
    )


# --- --verify, a new branch, and what a full manifest records -----------------------------------


def _stand_in(root: Path) -> dict[str, str]:
    """STAND_IN's .run files, and a manifest listing NVLSM (the AUR's real 2025.06.11 digests,
    not a pairing NVIDIA published), IMEX for x86_64 only and NVSDM (stand-in digests)."""
    runs = {arch: nvidia_tree.stand_in_run(root, STAND_IN, arch) for arch in ("amd64", "arm64")}
    stand_in = hashlib.sha256(b"stand-in archive").hexdigest()

    nvidia_tree.write_manifest(
        root,
        STAND_IN,
        {
            "release_label": STAND_IN,
            "nvlsm": nvidia_tree.listed(
                "nvlsm", NVLSM[0], {"linux-x86_64": NVLSM[1], "linux-sbsa": NVLSM[2]}
            ),
            "imex": nvidia_tree.listed("imex", STAND_IN, {"linux-x86_64": stand_in}),
            "libnvsdm": nvidia_tree.listed("libnvsdm", STAND_IN, {"linux-x86_64": stand_in}),
        },
    )
    return {**runs, "archive": stand_in}


def test_verify_hashes_each_run_and_a_new_branch_is_added_beside_the_others(
    nvidia: ReleaseServer, tmp_path: Path
) -> None:
    digests = _stand_in(nvidia.root)
    path = tmp_path / "versions.toml"
    path.write_text(TODAY_TEXT)
    written = _record(nvidia, path, STAND_IN, verify=True)
    assert written.startswith(TODAY_TEXT.rstrip("\n") + "\n\n"), "added after the last driver"
    run = nvidia.url(f"tesla/{STAND_IN}/NVIDIA-Linux-aarch64-{STAND_IN}.run")
    assert (
        f'sha256.arm64 = "{digests["arm64"]}"  # {nvidia.url("XFree86")}/Linux-aarch64/'
        f"{STAND_IN}/NVIDIA-Linux-aarch64-{STAND_IN}.run.sha256sum; --verify: {run} "
        "matches\n"
    ) in written
    entry = written[len(TODAY_TEXT) + 1 :]
    manifest = f"redistrib_{STAND_IN}.json"
    todo = f"not in {manifest}: `invoke record-driver {STAND_IN}` fills it once NVIDIA lists it"
    unlisted = f'version = "{STAND_IN}", amd64 = "TODO", arm64 = "TODO"'
    stand_in = digests["archive"]
    assert entry.splitlines()[-5:] == [
        f"fabricmanager = {{ {unlisted} }}  # {todo}",
        f"libnvidia_nscq = {{ {unlisted} }}  # {todo}",
        (
            f'nvlsm = {{ version = "2025.06.11", amd64 = "{NVLSM[1]}", arm64 = "{NVLSM[2]}" }}  # '
            f"{manifest}: nvlsm linux-x86_64, linux-sbsa"
        ),
        (
            f'imex = {{ version = "{STAND_IN}", amd64 = "{stand_in}", arm64 = "TODO" }}  # '
            f"{manifest}: imex linux-x86_64; none for linux-sbsa"
        ),
        (
            f'libnvsdm = {{ version = "{STAND_IN}", amd64 = "{stand_in}" }}  # '
            f"{manifest}: libnvsdm linux-x86_64"
        ),
    ]
    recorded = load_versions(path).driver(STAND_IN)
    assert recorded.redist_checksums("arm64") == {
        "fabricmanager.arm64": None,
        "libnvidia_nscq.arm64": None,
        "nvlsm.arm64": NVLSM[2],
        "imex.arm64": None,
    }


def test_verify_refuses_a_run_that_differs_from_its_checksum_file(
    nvidia: ReleaseServer, tmp_path: Path
) -> None:
    _stand_in(nvidia.root)
    run = nvidia.root / "tesla" / STAND_IN / f"NVIDIA-Linux-x86_64-{STAND_IN}.run"
    run.write_bytes(b"not the file the checksum was made of\n")
    path = tmp_path / "versions.toml"
    path.write_text(TODAY_TEXT)
    checksum = nvidia.url(
        f"XFree86/Linux-x86_64/{STAND_IN}/NVIDIA-Linux-x86_64-{STAND_IN}.run.sha256sum"
    )
    message = _refused_verify(nvidia, path)
    assert message.startswith(
        f"invoke record-driver: {nvidia.url(f'tesla/{STAND_IN}')}/"
        f"NVIDIA-Linux-x86_64-{STAND_IN}.run has SHA-256 "
        f"{hashlib.sha256(run.read_bytes()).hexdigest()}, but {checksum} "
        "says "
    )
    assert message.endswith(": the download or NVIDIA's file is wrong; nothing was written")


def _refused_verify(server: ReleaseServer, path: Path) -> str:
    before = path.read_bytes()
    with pytest.raises(Exit) as refused:
        _record(server, path, STAND_IN, verify=True)
    assert path.read_bytes() == before
    return str(refused.value.message)


# --- versions.toml as text -----------------------------------------------------------------------


def test_tables_of_one_driver_that_are_apart_are_refused() -> None:
    text = (
        todo_entry("580.1.1") + "\n" + todo_entry("595.1.1") + '\n[drivers."580.1.1".redist]\n'
        'fabricmanager = { version = "580.1.1", amd64 = "TODO" }\n'
    )
    with pytest.raises(RecordError, match=r"tables of driver 580\.1\.1 are not together"):
        versions_text.put_entry(text, todo_entry("580.2.1"), "580.2.1", "580.1.1")


def test_an_entry_goes_in_version_order_and_keeps_the_comments_around_it() -> None:
    text = (
        "# head\n\n# about 595\n"
        + todo_entry("595.1.1")
        + "\n# about 610\n"
        + todo_entry("610.1.1").rstrip("\n")
    )
    oldest = versions_text.put_entry(text, todo_entry("580.1.1"), "580.1.1", None)
    assert oldest == "# head\n\n" + todo_entry("580.1.1") + "\n" + text[len("# head\n\n") :] + "\n"
    between = versions_text.put_entry(text, todo_entry("600.1.1"), "600.1.1", None)
    assert between.index('"595.1.1"') < between.index('"600.1.1"') < between.index("# about 610")
    replaced = versions_text.put_entry(text, todo_entry("610.2.1"), "610.2.1", "610.1.1")
    assert replaced == text.replace("610.1.1", "610.2.1") + "\n"
    with pytest.raises(RecordError, match=r'no \[drivers\."620\.1\.1"\] table to replace'):
        versions_text.put_entry(text, todo_entry("620.2.1"), "620.2.1", "620.1.1")


def test_the_record_s_summary_names_what_was_left_todo() -> None:
    archive = recording.Archive("nvlsm", None, {"amd64": None, "arm64": None}, ())
    record = recording.Record(
        "580.1.1", (recording.Checksum("amd64", "ab" * 32, "u"),), "m", (archive,), DATE
    )
    assert record.summary() == ".run amd64; redist none; TODO: nvlsm"
    assert recording.summary_line(record, None, "v.toml") == (
        'wrote v.toml [drivers."580.1.1"] (added): .run amd64; redist none; TODO: nvlsm'
    )


@pytest.mark.parametrize("key", ["release_label", "fabricmanager"])
def test_a_manifest_that_gives_a_key_twice_is_refused(
    nvidia: ReleaseServer, tmp_path: Path, key: str
) -> None:
    driver = TODAY.drivers[0]
    path = nvidia.root / nvidia_tree.REDIST / f"redistrib_{driver.version}.json"
    text = path.read_text()
    start = text.index(f'"{key}":')
    value_end = text.index("\n    }", start) + 6 if text[start + len(key) + 4] == "{" else (
        text.index("\n", start))  # fmt: skip
    copy = text[start:value_end].rstrip(",")
    path.write_text(text.replace(f'"{key}":', f'{copy},\n    "{key}":', 1))
    versions = tmp_path / "versions.toml"
    versions.write_text(with_placeholder(driver, "580.1.1"))
    message = _refused(nvidia, versions, driver.version)
    assert f"gives {key!r} twice" in message


def test_a_small_file_that_trickles_fails_within_one_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """98 bytes at a byte every 0.2 s (NVIDIA's one-line checksum file, trickled): one deadline
    for every try, not a rate window per try."""
    for name, value in nvidia_tree.TRUST_LOOPBACK.items():
        monkeypatch.setenv(name, value)
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 98\r\n\r\n"
    body = [bytes([byte]) for byte in b"a" * 98]
    with raw_server(head, *body, pause=0.2, path="x.run.sha256sum") as url:
        started = time.monotonic()
        with pytest.raises(RecordError, match=r"did not finish within 1 s") as error:
            Nvidia(small_deadline=1.0).text(url, 4096, "a checksum file")
    assert time.monotonic() - started < 5
    assert "\n" not in str(error.value)


def test_a_checksum_file_that_is_not_utf8_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in nvidia_tree.TRUST_LOOPBACK.items():
        monkeypatch.setenv(name, value)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n\xff\xfe\x00x"
    with raw_server(answer, path="x.run.sha256sum") as url, pytest.raises(RecordError) as error:
        Nvidia().text(url, 4096, "a checksum file")
    assert str(error.value) == (
        f"{url} is not UTF-8 text (byte 0 is 0xff): not a checksum file; check the URL"
    )
