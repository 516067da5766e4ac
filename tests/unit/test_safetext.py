"""The one validator of names and values (safetext.py), and the log lines servers try to split."""

from __future__ import annotations

import re
import sys
import unicodedata

import pytest
from raw_server import raw_server

from nvidia_driver.errors import DriverError
from nvidia_driver.safetext import (
    MAX_LENGTH,
    check,
    module_name,
    module_parameter,
    shown,
    unsafe,
)
from nvidia_driver.sources.download import Backoff, Downloader, DownloadLimits

EVERY_CHARACTER = [chr(point) for point in range(sys.maxunicode + 1)]
MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-peermem")


def test_every_character_any_reader_may_break_a_line_at_is_refused() -> None:
    breaks = [c for c in EVERY_CHARACTER if len(f"a{c}b".splitlines()) > 1]
    controls = [c for c in EVERY_CHARACTER if unicodedata.category(c) in {"Cc", "Zl", "Zp"}]

    assert len(breaks) == 10  # \n \r \v \f \x1c \x1d \x1e \x85 \u2028 \u2029
    assert [c for c in breaks + controls if unsafe(c) is None] == []
    for character in breaks:
        with pytest.raises(DriverError, match=f"holds U\\+{ord(character):04X}, a line break"):
            check(f"4{character}FABRIC_MODE=1", "the value", "fix it")


@pytest.mark.parametrize(
    "text", ["\u202e", "\u200b", "\udcff", "\x00", "\x7f", "\x9b"], ids=repr
)  # bidi override, zero-width space, a lone surrogate, NUL, DEL, CSI
def test_invisible_and_undecodable_characters_are_refused(text: str) -> None:
    with pytest.raises(DriverError, match=r"a control character that would let it start"):
        check(f"x{text}y", "the value", "fix it")


def test_what_a_reader_shows_is_kept() -> None:
    for text in ('NVreg_RegistryDwords="RMFoo=1;RMBar=2"', "/var/log/fabricmanager.log",
                 "Ünïcödé, 中文, emoji 🙂", "tab-free spaces are fine"):  # fmt: skip
        assert check(text, "the value", "fix it") == text


def test_a_refusal_is_one_line_that_shows_the_text_escaped() -> None:
    with pytest.raises(DriverError) as raised:
        check("a\u2028b\rc", "the value", "fix it")

    assert str(raised.value) == (
        "the value 'a\\u2028b\\rc', which holds U+2028, a line break that would let it start a "
        "line of its own where it is written: fix it"
    )
    assert len(str(raised.value).splitlines()) == 1


def test_a_long_value_is_refused_and_not_shown_whole() -> None:
    with pytest.raises(DriverError) as raised:
        check("a" * (MAX_LENGTH + 1), "the value", "fix it")

    assert str(raised.value).endswith(f", which is over {MAX_LENGTH} characters: fix it")
    assert len(str(raised.value)) < 300


@pytest.mark.parametrize(
    ("name", "problem"),
    [("nvidia-uvm", None), ("nvidia_uvm", None), ("Nvidia", "is not a module name ([a-z0-9_-]+)"),
     ("nvidia.uvm", "is not a module name"), ("nvidia-drm", "is not one of the driver's modules"),
     ("", "is not a module name")],
)  # fmt: skip
def test_module_names_follow_modprobe_d_and_the_driver(name: str, problem: str | None) -> None:
    if problem is None:
        assert module_name(name, MODULES, "the module", "fix it") == name
        return
    with pytest.raises(DriverError, match=re.escape(f"the module {name!r}, which {problem}")):
        module_name(name, MODULES, "the module", "fix it")


@pytest.mark.parametrize(
    ("token", "accepted"),
    [("NVreg_EnableStreamMemOPs=1", True), ('NVreg_RegistryDwords="A=1;B=2"', True),
     ("uvm.perf=0", True), ("-C", False), ("=1", False), ("NVreg_X=", False),
     ("NVreg_X=a\u00a0b", False), ("1NVreg=1", False), ("install=x", True)],
)  # fmt: skip
def test_module_parameters_are_name_value_tokens(token: str, accepted: bool) -> None:
    # "install=x" is a parameter named install: on an options line it is no directive.
    if accepted:
        assert module_parameter(token, "the file holds", "fix it") == token
        return
    with pytest.raises(DriverError, match=r"is not a module parameter|holds U\+"):
        module_parameter(token, "the file holds", "fix it")


def test_untrusted_text_is_shown_escaped_on_one_line() -> None:
    assert shown("HTTP/1.1 OK-ish\r\n") == "HTTP/1.1 OK-ish"
    assert shown("Bad\x85ERROR: forged\u2028line \x1b[2J") == (
        "Bad\\x85ERROR: forged\\u2028line \\x1b[2J"
    )
    assert len(shown("x" * 10_000)) == 200


def test_shown_text_is_clipped_to_its_limit_with_a_mark_and_never_through_an_escape() -> None:
    assert shown("x" * 400, 400) == "x" * 400
    assert shown("x" * 401, 400) == "x" * 399 + "…"  # an annotation's, the reboot gate's
    assert shown("x" * 197 + "\u2028tail") == "x" * 197 + "…"  # \u2028 would not fit whole
    assert shown("\x1b" * 10_000) == "\\x1b" * 49 + "…"  # 49 escapes of 4, the mark


def test_a_server_s_status_line_cannot_split_the_download_s_log_line() -> None:
    status = b"HTTP/1.1 500 Oops\x85ERROR: forged\xe2\x80\xa8\x1b[2J\r\nContent-Length: 0\r\n\r\n"
    downloader = Downloader(DownloadLimits(deadline=5), Backoff(attempts=1))
    with raw_server(status) as url, pytest.raises(DriverError) as raised:
        downloader.get_small(url, 1024, "a DIGESTS file")

    message = str(raised.value)
    assert len(message.splitlines()) == 1
    assert unsafe(message) is None
    assert "answered HTTP 500 Oops\\x85ERROR: forged" in message


def test_a_url_with_a_line_break_is_refused_before_it_is_logged_or_requested() -> None:
    with pytest.raises(DriverError, match=r"^the URL 'https://mirror\.example/a\\nb', which holds"):
        Downloader().get_small("https://mirror.example/a\nb", 1024, "a DIGESTS file")
