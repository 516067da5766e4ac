"""What update_engine has staged, asked over the host's D-Bus system bus, as FLUO's agent asks.

Without FLUO there is no agent to put update_engine's ``NewVersion`` on the node, so the gate
asks update_engine itself: ``GetStatus`` of ``com.coreos.update1.Manager`` at
``/com/coreos/update1`` on the bus name ``com.coreos.update1`` (flatcar/update_engine
``src/update_engine/dbus_constants.h``, ``dbus_service.cc``: it returns last checked time,
progress, current operation, new version and new size, ``xdssx``). Its bus policy
(``com.coreos.update1.conf``) lets root and user ``core`` call it, so the pod needs the host's
``/run/dbus/system_bus_socket`` and core's uid (:data:`CORE_UID`), not root nor privilege:
FLUO's agent mounts the same (``examples/deploy/update-agent.yaml``).

The exchange (D-Bus Specification, "Authentication Protocol" and "Message Bus Specification"):
a NUL byte, ``AUTH EXTERNAL <uid in hex>``, ``OK <guid>``, ``BEGIN``; then ``Hello`` to the bus,
which every connection must send first, ``GetNameOwner`` for update_engine's unique name, then
the call. Only a method return (or error) to the call's serial whose sender the bus stamped
with that unique name is update_engine's answer: any other client may send a message with the
same reply serial. Every read is bounded in time and bytes.
"""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

from nvidia_driver.errors import DriverError
from nvidia_driver.formats import dbus
from nvidia_driver.safetext import shown

SYSTEM_BUS = Path("/run/dbus/system_bus_socket")
CORE_UID = 500  # Flatcar's user core (baselayout's /etc/passwd), whom the bus policy lets ask
# update_engine's preferences (system_state.cc kPrefsDirectory); the kured variant mounts them
# from the host, read only, at the same path.
PREFS = Path("/var/lib/update_engine/prefs")
# What update_engine reports as NewVersion when it was restarted while an update waited for the
# reboot: it knows that one waits (its marker file), not which (update_attempter.cc).
VERSION_ZERO = "0.0.0"
_FULL_RESPONSE = "full-response"  # kPrefsFullResponse: Omaha's last answer, saved
_PREVIOUS_VERSION = "previous-version"  # kPrefsPreviousVersion: set when an update is applied
_RESPONSE_LIMIT = 256 * 1024  # Omaha's answer: ~2 KB
# /response/app/updatecheck/manifest's version (omaha_request_action.cc kManifestNodeXPath).
_MANIFEST_VERSION = re.compile(r'<manifest\s+version="([0-9][0-9.]{0,40})"')
SERVICE = "com.coreos.update1"
OBJECT = "/com/coreos/update1"
INTERFACE = "com.coreos.update1.Manager"
NEED_REBOOT = "UPDATE_STATUS_UPDATED_NEED_REBOOT"  # update_attempter.h: staged, waiting
_BUS = ("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus")
_AUTH_LINE_LIMIT = 512
_MESSAGES_LIMIT = 64  # messages read while waiting for one reply (signals come in between)


def _failure(why: str) -> DriverError:
    return DriverError(
        f"cannot ask update_engine what it staged: {why}; the gate's pod needs the host's "
        f"{SYSTEM_BUS} mounted and uid {CORE_UID}, core's (deploy/reboot-gate/kured)"
    )


class _Connection:
    def __init__(self, path: Path, timeout: float) -> None:
        self.ends = time.monotonic() + timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.buffer = b""
        self.serial = 0
        try:
            self._wait()
            self.sock.connect(str(path))
        except OSError:
            self.sock.close()
            raise

    def _wait(self) -> None:
        remaining = self.ends - time.monotonic()
        if remaining <= 0:
            raise _failure("the bus did not answer in time")
        self.sock.settimeout(remaining)

    def _read_more(self) -> None:
        self._wait()
        chunk = self.sock.recv(4096)
        if not chunk:
            raise _failure("the bus closed the connection")
        self.buffer += chunk

    def auth_line(self, line: str) -> str:
        self.sock.sendall(line.encode() + b"\r\n")
        while b"\r\n" not in self.buffer:
            if len(self.buffer) > _AUTH_LINE_LIMIT:
                raise _failure("the bus's authentication answer is too long")
            self._read_more()
        answer, _, self.buffer = self.buffer.partition(b"\r\n")
        return answer.decode(errors="replace")

    def call(
        self, sender: str, destination: str, path: str, interface: str, member: str, *args: str
    ) -> dbus.Message:
        """The reply to the call: only a method return or error to its serial, from ``sender``
        (the bus, or the unique name that owns update_engine's), counts."""
        self.serial += 1
        self.sock.sendall(
            dbus.method_call(self.serial, destination, path, interface, member, *args)
        )
        for _ in range(_MESSAGES_LIMIT):
            message = self._message()
            if (
                message.reply_serial != self.serial
                or message.kind not in {dbus.METHOD_RETURN, dbus.ERROR}
                or message.sender != sender
            ):
                continue  # a signal (NameAcquired), another reply, or not the callee's
            if message.kind == dbus.ERROR:
                raise _failure(f"{member} failed: {shown(message.error_name, 120)}")
            return message
        raise _failure(f"no reply to {member} among {_MESSAGES_LIMIT} messages")

    def _message(self) -> dbus.Message:
        while True:
            message, self.buffer = dbus.split_message(self.buffer)
            if message is not None:
                return message
            self._read_more()


def read_staged(bus: Path = SYSTEM_BUS, timeout: float = 10.0) -> str:
    """The release update_engine has staged and waits to reboot into, else "" (its status's
    new version, when its current operation is :data:`NEED_REBOOT`)."""
    try:
        connection = _Connection(bus, timeout)
    except OSError as exc:
        raise _failure(f"{bus}: {shown(str(exc.strerror or exc), 120)}") from None
    try:
        connection.sock.sendall(b"\0")
        answer = connection.auth_line(f"AUTH EXTERNAL {str(os.getuid()).encode().hex()}")
        if not answer.startswith("OK "):
            raise _failure(f"the bus refused EXTERNAL authentication ({shown(answer, 80)})")
        connection.sock.sendall(b"BEGIN\r\n")
        connection.call(_BUS[0], *_BUS, "Hello")
        owner = connection.call(_BUS[0], *_BUS, "GetNameOwner", SERVICE).body
        if len(owner) != 1 or not isinstance(owner[0], str) or not owner[0].startswith(":"):
            raise _failure(f"GetNameOwner named no unique name for {SERVICE}")
        reply = connection.call(owner[0], SERVICE, OBJECT, INTERFACE, "GetStatus")
    except OSError as exc:
        raise _failure(shown(str(exc), 160)) from None
    finally:
        connection.sock.close()
    body = reply.body
    if len(body) != 5 or not isinstance(body[2], str) or not isinstance(body[3], str):  # noqa: PLR2004 - xdssx
        raise _failure("GetStatus answered no (xdssx) status")
    return body[3] if body[2] == NEED_REBOOT else ""


def staged_from_prefs(prefs: Path = PREFS) -> str:
    """The staged release, from the answer update_engine saved when it staged it (the version of
    its manifest), for when its status says :data:`VERSION_ZERO`. update_engine saves the
    answer at the update check and writes ``previous-version``, the release it runs, once the
    update is applied (flatcar/update_engine ``omaha_request_action.cc`` ``TransferComplete``,
    ``update_attempter.cc`` ``ProcessingDone``): so the answer is the older file while an update
    waits, and one that names the running release is an earlier update's."""
    response, previous = prefs / _FULL_RESPONSE, prefs / _PREVIOUS_VERSION
    try:
        with response.open("rb") as file:
            text = file.read(_RESPONSE_LIMIT + 1)
        with previous.open("rb") as file:
            running = file.read(64).decode(errors="replace").strip()
    except OSError as exc:
        raise DriverError(
            f"its saved answer {response} cannot be read: {shown(str(exc.strerror or exc), 80)}"
        ) from None
    found = _MANIFEST_VERSION.search(text[:_RESPONSE_LIMIT].decode(errors="replace"))
    if len(text) > _RESPONSE_LIMIT or found is None:
        raise DriverError(f"its saved answer {response} names no release (no manifest version)")
    if found.group(1) == running:
        raise DriverError(f"its saved answer {response} names the release the node runs, "
                          f"{shown(running, 40)}: an earlier update's")  # fmt: skip
    return found.group(1)
