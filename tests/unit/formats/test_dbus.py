"""D-Bus messages: written as the specification lays them out, read within bounds."""

from __future__ import annotations

import struct

import pytest
from fake_dbus import _decode_call, encode, status_body

from nvidia_driver.errors import DriverError
from nvidia_driver.formats import dbus


def test_a_method_call_is_laid_out_as_the_bus_reads_it() -> None:
    data = dbus.method_call(
        7, "com.coreos.update1", "/com/coreos/update1", "com.coreos.update1.Manager", "GetStatus"
    )
    assert data[:4] == b"l\x01\x00\x01"
    assert len(data) % 8 == 0
    assert dbus.message_length(data[:16]) == len(data)
    call = _decode_call(data)
    assert (call.serial, call.path, call.interface, call.member, call.destination) == (
        7,
        "/com/coreos/update1",
        "com.coreos.update1.Manager",
        "GetStatus",
        "com.coreos.update1",
    )


def test_a_method_call_carries_its_string_argument() -> None:
    data = dbus.method_call(
        8, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
        "GetNameOwner", "com.coreos.update1",
    )  # fmt: skip
    assert dbus.message_length(data[:16]) == len(data)
    call = _decode_call(data)
    assert (call.member, call.argument) == ("GetNameOwner", "com.coreos.update1")


def test_a_reply_of_basic_types_is_read() -> None:
    body = status_body(1786000000, 0.5, "UPDATE_STATUS_UPDATED_NEED_REBOOT", "4593.2.5", 1 << 30)
    data = encode(2, 9, [(5, "u", 7), (7, "s", ":1.3")], "xdssx", body)
    message = dbus.parse_message(data)
    assert message.kind == dbus.METHOD_RETURN
    assert (message.reply_serial, message.sender) == (7, ":1.3")
    assert message.body == (
        1786000000,
        0.5,
        "UPDATE_STATUS_UPDATED_NEED_REBOOT",
        "4593.2.5",
        1 << 30,
    )


def test_a_big_endian_message_is_read_too() -> None:
    """REPLY_SERIAL 3 and SIGNATURE "s", then the body "hello", all most significant first."""
    fields = bytes([5]) + b"\x01u\0" + struct.pack(">I", 3)  # 8 bytes: the next field aligned
    fields += bytes([8]) + b"\x01g\0" + b"\x01s\0"
    body = struct.pack(">I", 5) + b"hello\0"
    header = struct.pack(">cBBBIII", b"B", 2, 0, 1, len(body), 4, len(fields))
    data = header + fields + bytes(-(16 + len(fields)) % 8) + body
    message = dbus.parse_message(data)
    assert (message.reply_serial, message.body) == (3, ("hello",))


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"x" + bytes(15), "no D-Bus header"),
        (struct.pack("<cBBBIII", b"l", 2, 0, 1, 1 << 24, 1, 0), "over the limit"),
        (encode(2, 1, [(5, "u", 1)], "s", struct.pack("<I", 50) + b"short\0"), "past its end"),
        (encode(2, 1, [(5, "u", 1)], "a", b"\0" * 8), "not a basic type"),
        (encode(2, 1, [(5, "u", 1)], "s", struct.pack("<I", 2) + b"\xff\xfe\0"), "not UTF-8"),
    ],
)
def test_a_malformed_message_is_refused_in_one_line(data: bytes, why: str) -> None:
    with pytest.raises(DriverError, match=f"^malformed D-Bus message: .*{why}"):
        dbus.parse_message(data)
