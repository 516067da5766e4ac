"""The releases feed and lts-info as the tooling reads them: every odd feed and transfer.

Transfers go to a raw socket server on 127.0.0.1 that answers exactly the bytes a test gives
(raw_server.py: a short body, a broken status line, a trickle); feeds are the TSV-made
releases.json (tests/shared/flatcar_feed.py) with one thing changed.
"""

from __future__ import annotations

import gzip
import json
import time
from typing import Any

import pytest
from flatcar_feed import feed_entry, feed_from_tsv, lts_info_text
from raw_server import raw_server

from gdc.coverage import LtsInfo, ReleaseError, covered_releases, parse_lts_info, read_feed
from gdc.download import DownloadError, Limits, read_text
from gdc.versions import Versions, parse_versions

LTS = LtsInfo(parse_lts_info(lts_info_text()))


def _versions(*channels: str) -> Versions:
    return parse_versions({"images": {"channels": list(channels or ("stable", "beta", "alpha",
                                                                     "lts"))},
                           "drivers": {"610.57.04": {"sha256": {"amd64": "ab" * 32}}}})  # fmt: skip


def _covered(feed: dict[str, Any], *channels: str) -> tuple[dict[str, tuple[str, ...]], Any]:
    covered, excluded, notes = covered_releases(json.dumps(feed), _versions(*channels), LTS)
    return {c.version: c.streams for c in covered}, (excluded, notes)


def test_an_empty_feed_is_an_error_not_an_empty_matrix() -> None:
    with pytest.raises(ReleaseError, match=r"covers none of the channels versions\.toml lists"):
        covered_releases("{}", _versions(), LTS)


def test_a_per_channel_feed_covers_its_channel_and_excludes_the_others() -> None:
    full = feed_from_tsv()
    stable = {k: v for k, v in full.items() if v["channel"] == "stable"}  # releases-stable.json
    covered, (excluded, _) = _covered(stable)
    assert covered == {"4593.2.5": ("stable",)}
    reasons = {x.flatcar: x.reason for x in excluded}
    assert set(reasons) == {"alpha", "beta", "lts-2024"}
    assert reasons["beta"].startswith("the releases feed names no beta release (a per-channel")
    assert "has no 4081.3.x release" in reasons["lts-2024"]


def test_only_current_and_current_year_are_markers() -> None:
    feed = feed_from_tsv()
    feed["current-beta"] = {**feed["4757.1.0"], "channel": "stable"}  # an unknown object
    feed["next"] = {"channel": "stable", "release_date": "2099-01-01 00:00:00 +0000"}
    covered, (_, notes) = _covered(feed)
    assert covered["4593.2.5"] == ("stable",)  # stable does not drop out
    assert notes[0].startswith("the releases feed has 2 key(s) that are neither a version nor")


def test_unicode_digits_are_not_versions() -> None:
    feed = feed_from_tsv()
    fullwidth = "\uff14\uff15\uff19\uff13"  # 4593 in fullwidth digits: str.isdigit() says yes
    feed[f"{fullwidth}.2.9"] = feed_entry("stable", "2026-12-01", "6.12.200")
    feed["current-\uff12\uff10\uff12\uff15"] = feed["4081.3.10"]
    covered, (_, notes) = _covered(feed)
    assert "4593.2.9" not in covered
    assert f"{fullwidth}.2.9" not in covered
    assert "2 key(s)" in notes[0]


def test_a_bad_old_entry_is_reported_and_a_bad_current_one_excludes_its_stream() -> None:
    feed = feed_from_tsv()
    feed["4459.2.1"]["release_date"] = "last Tuesday"
    feed["4790.0.1"] = {**feed_entry("alpha", "2026-08-20", "6.12.103"), "architectures": "all"}
    covered, (excluded, notes) = _covered(feed)
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


def test_a_whole_body_is_read() -> None:
    with raw_server(_response(b'{"a": 1}')) as url:
        assert read_text(url) == '{"a": 1}'


def test_a_short_read_is_one_line() -> None:
    with raw_server(_response(b'{"a":', length=100)) as url, pytest.raises(DownloadError) as error:
        read_text(url)
    assert str(error.value).endswith("the connection closed after 5 bytes, before the whole body "
                                     "arrived")  # fmt: skip


def test_a_bad_status_line_is_one_line() -> None:
    with raw_server(b"HTTP/1.1 OK-ish\r\n\r\n") as url, pytest.raises(DownloadError) as error:
        read_text(url)
    assert "BadStatusLine" in str(error.value)
    assert "\n" not in str(error.value)


def test_a_gzip_body_is_inflated_and_a_non_utf8_one_refused() -> None:
    with raw_server(_response(gzip.compress(b'{"gz": true}'))) as url:
        assert read_text(url) == '{"gz": true}'
    with raw_server(_response(b'{"\xff": 1}')) as url, pytest.raises(DownloadError) as error:
        read_text(url)
    assert str(error.value).endswith("is not UTF-8 text (byte 2 is 0xff)")
    bomb = gzip.compress(b" " * 5000)
    with raw_server(_response(bomb)) as url, pytest.raises(DownloadError, match="inflates to"):
        read_text(url, Limits(max_bytes=4096))


def test_a_body_over_the_size_cap_is_refused() -> None:
    too_big = "is 5000 bytes, more than the 4096"
    with raw_server(_response(b"x" * 5000)) as url, pytest.raises(DownloadError, match=too_big):
        read_text(url, Limits(max_bytes=4096))


def test_a_trickling_server_is_cut_off_at_the_deadline() -> None:
    chunks = [_response(b"", length=1000)] + [b"x"] * 1000
    started = time.monotonic()
    with raw_server(*chunks, pause=0.05) as url, pytest.raises(DownloadError) as error:
        read_text(url, Limits(deadline=1.0))
    assert time.monotonic() - started < 3
    assert "past the 1 s deadline; the server is too slow" in str(error.value)


def test_an_unreachable_host_and_an_http_error_are_one_line() -> None:
    with pytest.raises(DownloadError, match=r"^cannot reach http://127\.0\.0\.1:9/"):
        read_text("http://127.0.0.1:9/releases.json")
    with (
        raw_server(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n") as url,
        pytest.raises(DownloadError, match="answered HTTP 404 Not Found"),
    ):
        read_text(url)
