"""A D-Bus system bus with update_engine on it, on a unix socket, for the kured gate's tests.

Written from the D-Bus Specification ("Authentication Protocol", "Message Protocol": the fixed
header, the a(yv) header fields, alignment from the start of the message) with its own
encoder, not the entrypoint's: a mistake shared by both would pass unseen otherwise. It speaks
what dbus-daemon does to a client: the AUTH EXTERNAL exchange (the uid, hex-encoded), a reply
to ``Hello`` with a unique name and a ``NameAcquired`` signal, then routes
``com.coreos.update1.Manager.GetStatus`` to update_engine's answer, ``(xdssx)``
(flatcar/update_engine ``dbus_service.cc``), or answers ``ServiceUnknown`` when update_engine
is not on the bus. ``GetNameOwner`` names update_engine's unique name, which is the sender of
its replies; with ``forge`` another client's reply to the same serial comes first (which
dbus-daemon's policy blocks, and another bus may not).
"""

from __future__ import annotations

import socket
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from local_server import Threaded

UNIQUE_NAME = ":1.42"
UPDATE_ENGINE_NAME = ":1.7"  # update_engine's unique name, the owner of com.coreos.update1
FORGER_NAME = ":1.66"
FORGED_VERSION = "4628.1.1"


def _pad(data: bytearray, size: int) -> None:
    data += bytes(-len(data) % size)


def _string(data: bytearray, text: str, *, signature: bool = False) -> None:
    encoded = text.encode()
    if signature:
        data += bytes([len(encoded)]) + encoded + b"\0"
        return
    _pad(data, 4)
    data += struct.pack("<I", len(encoded)) + encoded + b"\0"


def encode(
    kind: int,
    serial: int,
    fields: list[tuple[int, str, str | int]],
    body_signature: str = "",
    body: bytes = b"",
) -> bytes:
    """A little-endian message; body given already marshalled from offset 0 (a multiple of 8)."""
    data = bytearray(16)
    if body_signature:
        fields = [*fields, (8, "g", body_signature)]
    for code, kind_code, value in fields:
        _pad(data, 8)
        data += bytes([code])
        _string(data, kind_code, signature=True)
        if kind_code == "u":
            _pad(data, 4)
            data += struct.pack("<I", int(value))
        else:
            _string(data, str(value), signature=kind_code == "g")
    fields_length = len(data) - 16
    _pad(data, 8)
    struct.pack_into("<cBBBIII", data, 0, b"l", kind, 0, 1, len(body), serial, fields_length)
    return bytes(data) + body


def status_body(
    last_checked: int, progress: float, operation: str, version: str, size: int
) -> bytes:
    body = bytearray(struct.pack("<qd", last_checked, progress))
    _string(body, operation)
    _string(body, version)
    _pad(body, 8)
    body += struct.pack("<q", size)
    return bytes(body)


@dataclass
class Call:
    serial: int
    path: str
    interface: str
    member: str
    destination: str
    argument: str = ""  # the one string argument of a call with signature "s"


def _decode_call(data: bytes) -> Call:
    assert data[:1] == b"l" and data[1] == 1, "a little-endian method call"  # noqa: PT018
    body_length, serial, fields_length = struct.unpack_from("<III", data, 4)
    at, end, values = 16, 16 + fields_length, {}
    while at < end:
        at += -at % 8
        code, sig_length = data[at], data[at + 1]
        signature = data[at + 2 : at + 2 + sig_length].decode()
        at += 3 + sig_length
        if signature == "g":
            length = data[at]
            values[code] = data[at + 1 : at + 1 + length].decode()
            at += 2 + length
            continue
        at += -at % 4
        (length,) = struct.unpack_from("<I", data, at)
        values[code] = data[at + 4 : at + 4 + length].decode()
        at += 5 + length
        assert signature in {"s", "o"}, signature
    argument = ""
    if values.get(8) == "s":
        start = len(data) - body_length
        (length,) = struct.unpack_from("<I", data, start)
        argument = data[start + 4 : start + 4 + length].decode()
    call = Call(serial, values.get(1, ""), values.get(2, ""), values.get(3, ""), values.get(6, ""))
    call.argument = argument
    return call


@dataclass
class FakeSystemBus(Threaded):
    thread_name = "system-bus"

    path: Path
    operation: str = "UPDATE_STATUS_IDLE"
    new_version: str = "0.0.0"
    update_engine: bool = True  # on the bus at all
    forge: bool = False  # another client answers GetStatus first, with FORGED_VERSION staged
    uids: list[str] = field(default_factory=list)  # the uids clients authenticated as
    calls: list[Call] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self.path))
        self._server.listen(4)
        self._server.settimeout(0.05)
        self._stop = threading.Event()
        self._serial = 100

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._server.close()
        self.path.unlink()

    def stage(self, version: str) -> None:
        """update_engine has applied an update: it waits for a reboot into version."""
        self.operation, self.new_version = "UPDATE_STATUS_UPDATED_NEED_REBOOT", version

    def serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            with client:
                client.settimeout(5)
                self._session(client)

    def _session(self, client: socket.socket) -> None:
        with client.makefile("rb") as reader:
            self._converse(client, reader)

    def _converse(self, client: socket.socket, reader: BinaryIO) -> None:
        assert reader.read(1) == b"\0"
        line = reader.readline().decode().strip()
        method, _, hex_uid = line.removeprefix("AUTH ").partition(" ")
        if method != "EXTERNAL":
            client.sendall(b"REJECTED EXTERNAL\r\n")
            return
        self.uids.append(bytes.fromhex(hex_uid).decode())
        client.sendall(b"OK 1234deadbeef1234deadbeef1234dead\r\n")
        if reader.readline().strip() != b"BEGIN":
            return
        while True:
            fixed = reader.read(16)
            if len(fixed) < 16:
                return
            body_length, _, fields_length = struct.unpack_from("<III", fixed, 4)
            rest = reader.read(fields_length + (-(16 + fields_length) % 8) + body_length)
            call = _decode_call(fixed + rest)
            self.calls.append(call)
            client.sendall(self._answer(call))

    def _answer(self, call: Call) -> bytes:
        self._serial += 1
        reply = [(5, "u", call.serial), (6, "s", UNIQUE_NAME), (7, "s", "org.freedesktop.DBus")]
        if call.member == "Hello":
            body = bytearray()
            _string(body, UNIQUE_NAME)
            signal = encode(
                4,
                self._serial + 1000,
                [
                    (1, "o", "/org/freedesktop/DBus"),
                    (2, "s", "org.freedesktop.DBus"),
                    (3, "s", "NameAcquired"),
                    (6, "s", UNIQUE_NAME),
                ],
                "s",
                bytes(body),
            )
            return encode(2, self._serial, reply, "s", bytes(body)) + signal
        if call.member == "GetNameOwner" and self.update_engine:
            body = bytearray()
            _string(body, UPDATE_ENGINE_NAME)
            return encode(2, self._serial, reply, "s", bytes(body))
        if call.member == "GetStatus" and self.update_engine:
            body = status_body(1786000000, 0.0, self.operation, self.new_version, 0)
            own = [(5, "u", call.serial), (6, "s", UNIQUE_NAME), (7, "s", UPDATE_ENGINE_NAME)]
            answer = encode(2, self._serial, own, "xdssx", body)
            if not self.forge:
                return answer
            forged = [(5, "u", call.serial), (6, "s", UNIQUE_NAME), (7, "s", FORGER_NAME)]
            staged = status_body(0, 0.0, "UPDATE_STATUS_UPDATED_NEED_REBOOT", FORGED_VERSION, 0)
            return encode(2, self._serial + 500, forged, "xdssx", staged) + answer
        message = bytearray()
        if call.member == "GetNameOwner":
            error = [(4, "s", "org.freedesktop.DBus.Error.NameHasNoOwner"), *reply]
            _string(message, f"Could not get owner of name '{call.argument}': no such name")
            return encode(3, self._serial, error, "s", bytes(message))
        error = [(4, "s", "org.freedesktop.DBus.Error.ServiceUnknown"), *reply]
        _string(message, f"The name {call.destination} was not provided by any .service files")
        return encode(3, self._serial, error, "s", bytes(message))
