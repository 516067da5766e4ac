"""A private D-Bus system bus, with stand-ins for update_engine and logind on it.

The bus is the real ``dbus-daemon`` (Debian's dbus-daemon), listening on a unix socket in a
temporary directory, never the host's: the reboot managers and the gate that talk to it are
pointed at it (``DBUS_SYSTEM_BUS_ADDRESS``, which godbus reads: godbus/dbus v5.1.0
``conn_unix.go`` getSystemBusPlatformAddress) and given it at ``/run/dbus/system_bus_socket``
in a mount namespace of their own. Its policy is update_engine's own
(flatcar/update_engine ``com.coreos.update1.conf``), and anything else is allowed.

Two stand-ins connect to it as clients, each under the well-known name of what it stands in for:

* **update_engine** (flatcar/update_engine ``src/update_engine/dbus_constants.h``: bus name
  ``com.coreos.update1``, object ``/com/coreos/update1``, interface
  ``com.coreos.update1.Manager``; ``update_engine.xml``: ``GetStatus`` returns and the
  ``StatusUpdate`` signal carries ``(x last_checked_time, d progress, s current_operation,
  s new_version, x new_size)``). :meth:`UpdateEngine.stage` does what update_engine does once
  it has applied an update: its operation becomes ``UPDATE_STATUS_UPDATED_NEED_REBOOT``
  (``update_attempter.h``) with the new version, and it broadcasts ``StatusUpdate``.
* **logind**, whose ``Reboot(b interactive)`` (``org.freedesktop.login1.Manager`` at
  ``/org/freedesktop/login1``, as go-systemd v22.5.0 ``login1/dbus.go`` calls it) only records
  the call and answers. Nothing here can reboot anything.

Messages are written with the marshalling rules of the D-Bus Specification ("Message
Protocol") and read with the entrypoint's own reader (``nvidia_driver.formats.dbus``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fixtures.debian import ensure_packages
from fixtures.docker_env import stop_process

from nvidia_driver.formats import dbus

# flatcar/update_engine src/update_engine/dbus_constants.h
UPDATE_ENGINE = "com.coreos.update1"
UPDATE_ENGINE_PATH = "/com/coreos/update1"
UPDATE_ENGINE_INTERFACE = "com.coreos.update1.Manager"
STATUS_SIGNATURE = "xdssx"  # update_engine.xml GetStatus / StatusUpdate
IDLE = "UPDATE_STATUS_IDLE"  # update_attempter.h UpdateStatus
NEED_REBOOT = "UPDATE_STATUS_UPDATED_NEED_REBOOT"
# go-systemd v22.5.0 login1/dbus.go (dbusDest, dbusPath, dbusManagerInterface; Reboot)
LOGIND = "org.freedesktop.login1"
LOGIND_PATH = "/org/freedesktop/login1"
LOGIND_INTERFACE = "org.freedesktop.login1.Manager"
# The bus itself (D-Bus Specification, "Message Bus Specification").
BUS = ("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus")
DO_NOT_QUEUE, PRIMARY_OWNER = 4, 1  # RequestName's flag and answer
SOCKET = "system_bus_socket"  # the name under /run/dbus, as on the host
START_SECONDS = 20.0

# flatcar/update_engine com.coreos.update1.conf, as Flatcar installs it.
UPDATE_ENGINE_POLICY = """
  <policy user="root">
    <allow own="com.coreos.update1"/>
    <allow send_destination="com.coreos.update1"/>
  </policy>
  <policy user="core">
    <deny send_destination="com.coreos.update1"
          send_interface="org.freedesktop.DBus.Introspectable"/>
    <deny send_destination="com.coreos.update1" send_interface="org.freedesktop.DBus.Properties"/>
    <allow send_destination="com.coreos.update1" send_interface="com.coreos.update1.Manager"
           send_member="AttemptUpdate"/>
    <allow send_destination="com.coreos.update1" send_interface="com.coreos.update1.Manager"
           send_member="ResetStatus"/>
    <allow send_destination="com.coreos.update1" send_interface="com.coreos.update1.Manager"
           send_member="GetStatus"/>
  </policy>
  <policy context="default">
    <deny send_destination="com.coreos.update1"/>
  </policy>
"""

CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="*"/>
  </policy>
{update_engine}
</busconfig>
"""

Value = int | float | bool | str


# --- writing messages (D-Bus Specification, "Message Protocol"), little-endian --------------


def _put(data: bytearray, code: str, value: Value) -> None:
    """One basic value, aligned to its size from the start of the message (a body starts at a
    multiple of 8, so aligning from the body's start is the same)."""
    if code == "g":
        encoded = str(value).encode()
        data += bytes([len(encoded)]) + encoded + b"\0"
        return
    if code in {"s", "o"}:
        encoded = str(value).encode()
        data += bytes(-len(data) % 4)
        data += struct.pack("<I", len(encoded)) + encoded + b"\0"
        return
    form, size = {"y": ("B", 1), "b": ("I", 4), "u": ("I", 4), "i": ("i", 4),
                  "x": ("q", 8), "t": ("Q", 8), "d": ("d", 8)}[code]  # fmt: skip
    data += bytes(-len(data) % size)
    data += struct.pack(f"<{form}", value)


def encode(kind: int, serial: int, headers: Sequence[tuple[int, str, Value]],
           signature: str = "", values: Sequence[Value] = ()) -> bytes:  # fmt: skip
    body = bytearray()
    for code, value in zip(signature, values, strict=True):
        _put(body, code, value)
    fields = bytearray(dbus.FIXED_HEADER)
    for code, kind_code, value in [*headers, *([(dbus.SIGNATURE, "g", signature)]
                                               if signature else [])]:  # fmt: skip
        fields += bytes(-len(fields) % 8)
        fields.append(code)
        _put(fields, "g", kind_code)
        _put(fields, kind_code, value)
    array_length = len(fields) - dbus.FIXED_HEADER
    fields += bytes(-len(fields) % 8)
    struct.pack_into("<cBBBIII", fields, 0, b"l", kind, 0, 1, len(body), serial, array_length)
    return bytes(fields + body)


# --- a client of the bus that owns a name and answers calls ---------------------------------

Handler = Callable[[dbus.Message], tuple[str, Sequence[Value]]]


class _Service:
    """One connection to the bus, owning ``name``; calls to it go to ``handlers[member]``."""

    def __init__(self, address: Path, name: str, handlers: dict[str, Handler]) -> None:
        self.name = name
        self.handlers = handlers
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(address))
        self.sock.settimeout(10)
        self.buffer = b""
        self.serial = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.sock.sendall(b"\0AUTH EXTERNAL " + str(os.getuid()).encode().hex().encode() + b"\r\n")
        while b"\r\n" not in self.buffer:
            self._read_more()
        answer, _, self.buffer = self.buffer.partition(b"\r\n")
        if not answer.startswith(b"OK "):
            raise RuntimeError(f"the private bus refused {name}: {answer!r}")
        self.sock.sendall(b"BEGIN\r\n")
        self._call(*BUS, "Hello")
        (owned,) = self._call(*BUS, "RequestName", signature="su", values=(name, DO_NOT_QUEUE))
        if owned != PRIMARY_OWNER:
            raise RuntimeError(f"{name} is owned already on the private bus ({owned})")
        self.sock.settimeout(0.2)
        self.thread = threading.Thread(target=self._serve, name=f"bus:{name}", daemon=True)
        self.thread.start()

    def _read_more(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the private bus closed the connection")
        self.buffer += chunk

    def _message(self) -> dbus.Message:
        while True:
            message, self.buffer = dbus.split_message(self.buffer)
            if message is not None:
                return message
            self._read_more()

    def _send(self, kind: int, headers: list[tuple[int, str, Value]], signature: str = "",
              values: Sequence[Value] = ()) -> int:  # fmt: skip
        with self.lock:
            self.serial += 1
            self.sock.sendall(encode(kind, self.serial, headers, signature, values))
            return self.serial

    def _call(self, destination: str, path: str, interface: str, member: str, *,
              signature: str = "", values: Sequence[Value] = ()) -> tuple[Value, ...]:  # fmt: skip
        serial = self._send(dbus.METHOD_CALL, [(dbus.PATH, "o", path),
                                               (dbus.INTERFACE, "s", interface),
                                               (dbus.MEMBER, "s", member),
                                               (dbus.DESTINATION, "s", destination)],
                            signature, values)  # fmt: skip
        while True:
            message = self._message()
            if message.reply_serial == serial and message.kind == dbus.METHOD_RETURN:
                return message.body
            if message.reply_serial == serial:
                raise RuntimeError(f"{member} failed: {message.error_name}")

    def signal(self, path: str, interface: str, member: str, signature: str,
               values: Sequence[Value]) -> None:  # fmt: skip
        self._send(dbus.SIGNAL, [(dbus.PATH, "o", path), (dbus.INTERFACE, "s", interface),
                                 (dbus.MEMBER, "s", member)], signature, values)  # fmt: skip

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                message = self._message()
            except TimeoutError:
                continue
            except (OSError, ConnectionError):
                return
            if message.kind != dbus.METHOD_CALL:
                continue  # NameAcquired and the like
            caller = [(dbus.REPLY_SERIAL, "u", message.serial),
                      (dbus.DESTINATION, "s", message.sender)]  # fmt: skip
            handler = self.handlers.get(str(message.fields.get(dbus.MEMBER, "")))
            if handler is None:
                self._send(
                    dbus.ERROR,
                    [(dbus.ERROR_NAME, "s", "org.freedesktop.DBus.Error.UnknownMethod"), *caller],
                )
                continue
            signature, values = handler(message)
            self._send(dbus.METHOD_RETURN, caller, signature, values)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@dataclass
class UpdateEngine:
    """The stand-in for update_engine (see the module's docstring)."""

    operation: str = IDLE
    new_version: str = "0.0.0"  # what update_engine reports while nothing is staged
    calls: list[str] = field(default_factory=list)
    _service: _Service | None = None

    def status(self) -> tuple[Value, ...]:
        return (int(time.time()), 0.0, self.operation, self.new_version, 0)

    def get_status(self, message: dbus.Message) -> tuple[str, Sequence[Value]]:
        self.calls.append(f"GetStatus from {message.sender}")
        return STATUS_SIGNATURE, self.status()

    def stage(self, version: str) -> None:
        """An update applied: waiting for the reboot into version (update_attempter.cc sets
        the status and broadcasts it, as dbus_service.cc's StatusUpdate)."""
        self.operation, self.new_version = NEED_REBOOT, version
        if self._service is not None:
            self._service.signal(UPDATE_ENGINE_PATH, UPDATE_ENGINE_INTERFACE, "StatusUpdate",
                                 STATUS_SIGNATURE, self.status())  # fmt: skip


@dataclass
class Logind:
    """The stand-in for logind's Reboot: it records the call, and reboots nothing."""

    reboots: list[bool] = field(default_factory=list)  # each call's "interactive" argument

    def reboot(self, message: dbus.Message) -> tuple[str, Sequence[Value]]:
        if message.fields.get(dbus.INTERFACE) != LOGIND_INTERFACE:
            raise RuntimeError(f"unexpected call to logind: {message.fields}")
        self.reboots.append(bool(message.body[0]) if message.body else False)
        return "", ()


@dataclass
class SystemBus:
    directory: Path  # holds system_bus_socket: what is mounted at /run/dbus
    update_engine: UpdateEngine
    logind: Logind

    @property
    def socket(self) -> Path:
        return self.directory / SOCKET


@contextlib.contextmanager
def private_system_bus(workdir: Path, logs: Path, *, staged: str = "") -> Iterator[SystemBus]:
    """dbus-daemon on ``workdir/run-dbus/system_bus_socket`` with update_engine (with ``staged``
    already waiting for a reboot, if given) and logind on it; all stopped on the way out."""
    ensure_packages(["dbus-daemon"])
    directory = workdir / "run-dbus"
    directory.mkdir(parents=True, exist_ok=True)
    bus = SystemBus(directory, UpdateEngine(), Logind())
    if staged:
        bus.update_engine.operation, bus.update_engine.new_version = NEED_REBOOT, staged
    config = workdir / "system-bus.conf"
    config.write_text(CONFIG.format(socket=bus.socket, update_engine=UPDATE_ENGINE_POLICY))
    with (logs / "dbus-daemon.log").open("ab") as out:
        daemon = subprocess.Popen(["dbus-daemon", f"--config-file={config}", "--nofork",
                                   "--nopidfile", "--print-address"],
                                  stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
    services: list[_Service] = []
    try:
        deadline = time.monotonic() + START_SECONDS
        while not bus.socket.exists():
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dbus-daemon did not start ({daemon.poll()}): see its log")
            time.sleep(0.1)
        engine = _Service(bus.socket, UPDATE_ENGINE, {"GetStatus": bus.update_engine.get_status})
        services.append(engine)
        bus.update_engine._service = engine
        services.append(_Service(bus.socket, LOGIND, {"Reboot": bus.logind.reboot}))
        yield bus
    finally:
        for service in services:
            service.close()
        stop_process(daemon)
