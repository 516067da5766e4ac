"""The releases feed and lts-info as the tooling reads them: every odd feed and transfer.

Transfers go to a raw socket server on 127.0.0.1 that answers exactly the bytes a test gives
(raw_server.py: a short body, a broken status line, a trickle); feeds are the TSV-made
releases.json (tests/shared/flatcar_feed.py) with one thing changed.
"""

from __future__ import annotations

import functools
import gzip
import json
from typing import Any

import pytest
from flatcar_feed import feed_entry, feed_from_tsv, lts_info_text, with_markers
from raw_server import raw_server

from gdc import releases
from gdc.coverage import LtsInfo, ReleaseError, covered_releases, parse_lts_info, read_feed
from gdc.versions import Versions, parse_versions
from nvidia_driver import limits
from nvidia_driver.errors import DriverError
from nvidia_driver.sources.download import Backoff, Downloader, DownloadLimits, feed_downloader

LTS = LtsInfo(parse_lts_info(lts_info_text()))


def _versions(*channels: str) -> Versions:
    return parse_versions({"images": {"channels": list(channels or ("stable", "beta", "alpha",
                                                                     "lts"))},
                           "drivers": {"610.57.04": {"sha256": {"amd64": "ab" * 32}}}})  # fmt: skip


def _read(text: str, *channels: str) -> tuple[dict[str, tuple[str, ...]], Any, tuple[str, ...]]:
    """The feed's releases read: each covered version's streams, the exclusions, the notes."""
    covered, excluded, notes = covered_releases(text, _versions(*channels), LTS)
    return {c.version: c.streams for c in covered}, excluded, notes


def test_an_empty_feed_is_an_error_not_an_empty_matrix() -> None:
    with pytest.raises(ReleaseError, match=r"covers none of the channels versions\.toml lists"):
        covered_releases("{}", _versions(), LTS)


def test_a_per_channel_feed_covers_its_channel_and_excludes_the_others() -> None:
    full = feed_from_tsv()
    stable = {k: v for k, v in full.items() if v["channel"] == "stable"}  # releases-stable.json
    covered, excluded, _ = _read(json.dumps(stable))
    assert covered == {"4593.2.5": ("stable",)}
    reasons = {x.flatcar: x.reason for x in excluded}
    assert set(reasons) == {"alpha", "beta", "lts-2024"}
    assert reasons["beta"].startswith("the releases feed names no beta release (a per-channel")
    assert "has no 4081.3.x release" in reasons["lts-2024"]


def test_only_current_and_current_year_are_markers() -> None:
    feed = feed_from_tsv()
    feed["current-beta"] = {**feed["4757.1.0"], "channel": "stable"}  # an unknown object
    feed["next"] = {"channel": "stable", "release_date": "2099-01-01 00:00:00 +0000"}
    covered, _, notes = _read(json.dumps(feed))
    assert covered["4593.2.5"] == ("stable",)  # stable does not drop out
    assert notes[0].startswith("the releases feed has 2 key(s) that are neither a version nor")


def test_unicode_digits_are_not_versions() -> None:
    feed = feed_from_tsv()
    fullwidth = "\uff14\uff15\uff19\uff13"  # 4593 in fullwidth digits: str.isdigit() says yes
    feed[f"{fullwidth}.2.9"] = feed_entry("stable", "2026-12-01", "6.12.200")
    feed["current-\uff12\uff10\uff12\uff15"] = feed["4081.3.10"]
    covered, _, notes = _read(json.dumps(feed))
    assert "4593.2.9" not in covered
    assert f"{fullwidth}.2.9" not in covered
    assert "2 key(s)" in notes[0]


def test_a_bad_old_entry_is_reported_and_a_bad_current_one_excludes_its_stream() -> None:
    feed = feed_from_tsv()
    feed["4459.2.1"]["release_date"] = "last Tuesday"
    feed["4790.0.1"] = {**feed_entry("alpha", "2026-08-20", "6.12.103"), "architectures": "all"}
    covered, excluded, notes = _read(json.dumps(feed))
    assert "4790.0.0" not in covered  # no silent fallback to an older alpha
    assert [x.flatcar for x in excluded] == ["4790.0.1"]
    assert "its architectures is not a list of names" in excluded[0].reason
    assert "4459.2.1 its release_date 'last Tuesday' is not" in notes[-1]


def test_lts_info_supported_and_unsupported_streams() -> None:
    feed = feed_from_tsv()
    feed["4459.3.0"] = feed_entry("lts", "2026-08-01", "6.12.60")
    info = LtsInfo(parse_lts_info("4081:2024:unsupported\n4459:2025:supported\n"))
    covered, excluded, _ = covered_releases(json.dumps(feed), _versions("lts"), info)
    assert {c.version: c.streams for c in covered} == {"4459.3.0": ("lts-2025",)}
    assert [(x.flatcar, x.reason) for x in excluded] == [
        ("lts-2024", "lts-2024 (Flatcar 4081) is no longer supported (lts-info)")]  # fmt: skip


@pytest.mark.parametrize(
    "text", ["", "4081:2024\n", "4081:2024:maybe\n", "\uff14\uff10\uff18\uff11:2024:supported"]
)
def test_a_malformed_lts_info_is_refused(text: str) -> None:
    with pytest.raises(ReleaseError, match="lts-info"):
        parse_lts_info(text)


def test_the_feed_parser_keeps_every_entry_by_itself() -> None:
    feed = read_feed(json.dumps({"1.2.3": [], "4593.2.5": feed_from_tsv()["4593.2.5"]}))
    assert [str(v) for v in feed.releases] == ["4593.2.5"]
    assert feed.unusable[next(iter(feed.unusable))].reason == "the entry is not an object"


# --- transfers ---------------------------------------------------------------------------------


def _response(body: bytes, *, length: int | None = None, headers: str = "") -> bytes:
    size = len(body) if length is None else length
    return (f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n{headers}Connection: close\r\n\r\n"
            ).encode() + body  # fmt: skip


# The reboot gate's reader (sources/download.py), with quick retries: its transfers' own cases
# are tests/unit/sources/test_download.py's and test_hostile_servers.py's.
QUICK = Downloader(DownloadLimits(deadline=5.0), Backoff(attempts=2, first_delay=0.01))
read_text = functools.partial(releases.read_text, downloader=QUICK)


def test_a_whole_body_is_read_and_a_gzip_one_inflated() -> None:
    with raw_server(_response(b'{"a": 1}')) as url:
        assert read_text(url) == '{"a": 1}'
    with raw_server(_response(gzip.compress(b'{"gz": true}'))) as url:
        assert read_text(url) == '{"gz": true}'


def test_the_tooling_reads_the_feed_as_the_reboot_gate_does() -> None:
    downloader = feed_downloader({})
    assert downloader.limits.deadline == limits.FEED_SECONDS
    assert downloader.limits.redirect_hosts == DownloadLimits().redirect_hosts  # Flatcar's


def test_a_short_read_is_one_line() -> None:
    with raw_server(_response(b'{"a":', length=100)) as url, pytest.raises(DriverError) as error:
        read_text(url)
    assert f"download of {url} was truncated: got 5 of 100 bytes" in str(error.value)


def test_a_bad_status_line_is_one_line() -> None:
    with raw_server(b"HTTP/1.1 OK-ish\r\n\r\n") as url, pytest.raises(DriverError) as error:
        read_text(url)
    assert str(error.value).startswith(f"cannot reach {url}: HTTP/1.1 OK-ish")
    assert "\n" not in str(error.value)


def test_a_non_utf8_feed_is_refused() -> None:
    with raw_server(_response(b'{"\xff": 1}')) as url, pytest.raises(DriverError) as error:
        read_text(url)
    assert str(error.value).startswith(f"{url} is not UTF-8 text (byte 2 is 0xff)")


def test_an_unreachable_host_and_an_http_error_are_one_line() -> None:
    with pytest.raises(DriverError, match=r"^cannot reach http://127\.0\.0\.1:9/"):
        read_text("http://127.0.0.1:9/releases.json")
    with (
        raw_server(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n") as url,
        pytest.raises(DriverError, match=r"releases\.json does not exist \(HTTP 404\)"),
    ):
        read_text(url)


# --- ambiguities: each is named in a note or refused, never resolved silently ------------------


def _json(pairs: list[tuple[str, Any]]) -> str:
    """A JSON object with the pairs in order, a key given twice if pairs repeat it."""
    return "{" + ", ".join(f"{json.dumps(key)}: {json.dumps(value)}" for key, value in pairs) + "}"


def test_an_identical_duplicate_key_is_read_once_with_a_note() -> None:
    feed = feed_from_tsv()
    text = _json([*feed.items(), ("4593.2.5", feed["4593.2.5"])])
    covered, excluded, notes = _read(text)
    assert covered["4593.2.5"] == ("stable",)
    assert excluded == ()
    [note] = notes
    assert note == (
        "the releases feed gives 1 key(s) twice, identically: one copy of each is "
        'read: ["4593.2.5"]'
    )


def test_a_conflicting_duplicate_is_refused_naming_where() -> None:
    feed = feed_from_tsv()
    # The current stable release gives its kernel twice: its stream is excluded, not guessed.
    entry = json.dumps(feed["4593.2.5"])
    twice = entry.replace('"major_software": {', '"major_software": {"kernel": ["6.12.99"], ', 1)
    text = _json(list(feed.items())).replace(f'"4593.2.5": {entry}', f'"4593.2.5": {twice}')
    text = text.replace(f'"current": {entry}', f'"current": {twice}')
    covered, excluded, _ = _read(text)
    assert "4593.2.5" not in covered
    assert [x.flatcar for x in excluded] == ["4593.2.5"]
    assert excluded[0].reason.startswith(
        'Flatcar 4593.2.5 (stable) gives ["major_software"]["kernel"] twice with different values '
        "in the releases feed: which one is meant is ambiguous")  # fmt: skip
    # A version key given twice with different entries: the same.
    newer = feed_entry("beta", "2026-08-20", "6.12.103")
    covered, excluded, _ = _read(_json([*feed.items(), ("4757.1.0", newer)]))
    assert "4757.1.0" not in covered
    assert "4757.1.0 (beta) is listed twice in the releases feed with different" in \
        excluded[0].reason  # fmt: skip
    # A marker given twice differently is ignored, with a note.
    covered, _, notes = _read(_json([*feed.items(), ("current", feed["4459.2.1"])]))
    assert covered["4593.2.5"] == ("stable",)
    assert "gives its 'current' marker twice with different values: ignored" in notes[0]


def test_a_version_far_above_the_feed_is_skipped_with_a_note() -> None:
    feed = feed_from_tsv()
    feed["45930.2.5"] = feed_entry("stable", "2026-09-01", "6.12.110")  # a typo of 4593.2.5
    feed["999999999.0.0"] = feed_entry("alpha", "2026-09-01", "6.12.110")
    covered, excluded, notes = _read(json.dumps(feed))
    assert covered["4593.2.5"] == ("stable",)
    assert covered["4790.0.0"] == ("alpha",)
    assert excluded == ()
    [note] = notes
    assert note == (
        "the releases feed has 2 version(s) more than 1000 majors above its other "
        "releases, skipped as implausible (a typo?): 45930.2.5, 999999999.0.0"
    )
    # A feed of one far-off release alone (a test release, a mirror's own) is read as it is;
    # an old stray version below the releases is harmless.
    alone = {"9999.2.0": feed_entry("stable", "2026-11-20", "6.12.117"), "1.2.3": []}
    assert _read(json.dumps(alone), "stable")[0] == {"9999.2.0": ("stable",)}


def test_a_leading_zero_is_read_as_the_version_it_spells_with_a_note() -> None:
    feed = feed_from_tsv()
    feed["4593.02.6"] = feed_entry("stable", "2026-09-01", "6.12.110")
    feed["4757.01.0"] = feed_entry("beta", "2026-09-01", "6.12.110")  # 4757.1.0 is there too
    feed.pop("current")
    covered, _, notes = _read(json.dumps(feed))
    assert covered["4593.2.6"] == ("stable",)
    assert covered["4757.1.0"] == ("beta",)  # its own entry, not the leading-zero one
    assert notes[0] == (
        "the releases feed has version key(s) with a leading zero, read as the "
        "version they spell: '4593.02.6' as 4593.2.6"
    )
    assert notes[1] == (
        "the releases feed has version key(s) with a leading zero, ignored: "
        "'4757.01.0' (4757.1.0 is there too)"
    )


def test_a_channel_name_is_exact_and_a_near_miss_gets_a_note() -> None:
    feed = feed_from_tsv()
    feed["4593.2.6"] = feed_entry("Stable", "2026-09-01", "6.12.110")
    feed["4790.0.1"] = feed_entry(" alpha", "2026-09-01", "6.12.110")
    feed["4790.0.2"] = feed_entry("nightly", "2026-09-02", "6.12.110")  # not a near miss
    covered, _, notes = _read(json.dumps(feed))
    assert covered["4593.2.5"] == ("stable",)
    assert covered["4790.0.0"] == ("alpha",)
    [note] = notes
    assert note == (
        "2 feed entries name a channel that differs from a known one only in case or "
        "spaces, and count as no channel (channel names are exact): 4593.2.6 "
        "'Stable', 4790.0.1 ' alpha'"
    )


def test_a_release_listing_two_kernels_is_refused() -> None:
    feed = feed_from_tsv()
    feed["4790.0.1"] = feed_entry("alpha", "2026-08-20", "6.12.103")
    feed["4790.0.1"]["major_software"]["kernel"] = ["6.12.103", "6.12.104"]
    covered, excluded, _ = _read(json.dumps(feed))
    assert "4790.0.0" not in covered  # no silent fallback to the previous alpha either
    assert excluded[0].reason.startswith(
        "Flatcar 4790.0.1 (alpha) lists 2 kernels in the releases feed (major_software.kernel: "
        "'6.12.103', '6.12.104'): which one its nodes boot is ambiguous")  # fmt: skip
    feed["4790.0.1"]["major_software"]["kernel"] = ["6.12.103", "6.12.103"]  # one kernel, twice
    assert _read(json.dumps(feed))[0]["4790.0.1"] == ("alpha",)


FULLWIDTH_SIX = "\uff16"  # str.isdigit() says yes


@pytest.mark.parametrize("kernel", ["", "junk", "6", "6.12.102 ", f"{FULLWIDTH_SIX}.12.102", 6.12,
                                    None, "6.12.102-" + "x" * 64])  # fmt: skip
def test_a_kernel_that_is_not_a_kernel_release_is_refused(kernel: object) -> None:
    feed = feed_from_tsv()
    feed["4790.0.1"] = feed_entry("alpha", "2026-08-20", "6.12.103")
    feed["4790.0.1"]["major_software"]["kernel"] = [kernel]
    covered, excluded, _ = _read(json.dumps(feed))
    assert "4790.0.1" not in covered
    [exclusion] = excluded
    assert exclusion.flatcar == "4790.0.1"
    assert "in the releases feed (major_software.kernel) that is not a kernel release" in \
        exclusion.reason  # fmt: skip


# --- every error of a feed or lts-info read is one line ----------------------------------------

LOOP = b"HTTP/1.1 308 Permanent Redirect\r\nLocation: /releases.json\r\nContent-Length: 0\r\n\r\n"


BROKEN_ANSWERS = {
    "redirect-loop": LOOP,
    "redirect-elsewhere": (
        b"HTTP/1.1 302 Found\r\nLocation: ftp://elsewhere/x\r\nContent-Length: 0\r\n\r\n"
    ),
    "folded-status": b"HTTP/1.1 500 Internal\r\n Server Error\r\nContent-Length: 0\r\n\r\n",
    "bad-status-line": b"HTTP/1.1 OK-ish\r\n\r\n",
    "short": _response(b'{"a":', length=100),
    "not-utf8": _response(b'{"\xff": 1}'),
    "gzip-cut": _response(gzip.compress(b"{}")[:-6]),
    "gzip-damaged": _response(b"\x1f\x8bnot gzip"),
    "closed": b"",
}


@pytest.mark.parametrize("answer", BROKEN_ANSWERS.values(), ids=BROKEN_ANSWERS.keys())
def test_every_feed_and_lts_info_error_is_one_line(answer: bytes) -> None:
    with raw_server(answer) as url:
        with pytest.raises(ReleaseError) as error:
            releases.load_feed(url, read_text)
        info = releases.lts_info({}, read_text, override=url)
    for message in (str(error.value), info.unavailable):
        assert message, answer
        assert "\n" not in message, message


def test_a_redirect_loop_says_so() -> None:
    with raw_server(LOOP) as url, pytest.raises(DriverError) as error:
        read_text(url)
    assert str(error.value) == (
        f"{url} redirects in a loop (HTTP 308, more than 5 redirects or the same URL again): "
        "check the URL or the mirror's redirects"
    )


# --- what the feed does wrong is said, never silent --------------------------------------------


def test_a_current_marker_on_an_older_stable_release_is_followed_with_a_note() -> None:
    feed = feed_from_tsv()
    feed["current"] = feed["4459.2.4"] if "4459.2.4" in feed else feed["4081.2.1"]
    covered, _, notes = _read(json.dumps(feed), "stable")
    older = next(iter(covered))
    assert covered == {older: ("stable",)}
    assert any(
        note.startswith(
            f"the feed's 'current' marker copies stable {older}, older "
            "than its newest stable release 4593.2.5"
        )
        for note in notes
    ), notes


def test_an_lts_stream_lts_info_does_not_list_gets_a_note() -> None:
    feed = feed_from_tsv()
    feed["4230.3.1"] = feed_entry("lts", "2026-08-01", "6.6.99")
    feed = with_markers(feed)
    feed["current-2025"] = feed["4230.3.1"]
    covered, _, notes = _read(json.dumps(feed), "lts")
    assert "4230.3.1" not in covered
    assert any("lts-info does not list" in note and "current-2025" in note for note in notes), notes


def test_a_kernel_given_as_a_string_is_named_so_not_no_kernel() -> None:
    feed = feed_from_tsv()
    feed["4593.2.5"]["major_software"]["kernel"] = "6.12.102"
    _, excluded, _ = _read(json.dumps(with_markers(feed)), "stable", "beta")
    reason = next(x.reason for x in excluded if x.flatcar == "4593.2.5")
    assert "has no kernel" not in reason
    assert "gives its kernel as the string '6.12.102', not a list" in reason


def test_a_current_release_excluded_for_a_feed_problem_needs_a_person() -> None:
    feed = feed_from_tsv()
    feed["4593.2.6"] = feed_entry("stable", "2026-09-10", "junk")
    _, excluded, _ = _read(json.dumps(with_markers(feed)), "stable", "beta")
    blocking = [x for x in excluded if x.blocking]
    assert [x.flatcar for x in blocking] == ["4593.2.6"]
