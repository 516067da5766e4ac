"""D-Bus messages, written and read within bounds (the D-Bus Specification, "Message Protocol").

Just what a client needs to call a method with string arguments and read a reply of basic
types:

* a message is a 16-byte fixed header (endianness ``l``/``B``, type, flags, version 1, body
  length, serial), an array of header fields ``a(yv)``, padding to 8, then the body;
* values are aligned to their size (strings and arrays to 4, 64-bit values and structs to 8,
  from the start of the message); a string is a u32 length, its UTF-8 bytes and a NUL; a
  signature a byte length, its bytes and a NUL; a variant a signature and one value.

Containers in a body (arrays, structs, variants) are refused, as is any message over
:data:`MAX_MESSAGE` bytes (the specification allows 128 MiB; a status reply is ~100 bytes).
Nothing here knows what is being called: the callers give the names.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from nvidia_driver.errors import DriverError

MAX_MESSAGE = 1 << 20
FIXED_HEADER = 16
METHOD_CALL, METHOD_RETURN, ERROR, SIGNAL = 1, 2, 3, 4
# Header field codes.
PATH, INTERFACE, MEMBER, ERROR_NAME, REPLY_SERIAL, DESTINATION, SENDER, SIGNATURE = range(1, 9)
_FIELD_TYPES = {PATH: "o", INTERFACE: "s", MEMBER: "s", ERROR_NAME: "s", REPLY_SERIAL: "u",
                DESTINATION: "s", SENDER: "s", SIGNATURE: "g", 9: "u"}  # fmt: skip
# Basic types: struct format and alignment; strings (s, o) and signatures (g) apart.
_FIXED = {"y": ("B", 1), "b": ("I", 4), "n": ("h", 2), "q": ("H", 2), "i": ("i", 4),
          "u": ("I", 4), "x": ("q", 8), "t": ("Q", 8), "d": ("d", 8)}  # fmt: skip
_ORDER = {ord("l"): "<", ord("B"): ">"}

Value = int | float | bool | str


@dataclass(frozen=True)
class Message:
    kind: int
    serial: int
    fields: dict[int, Value]
    body: tuple[Value, ...]

    @property
    def reply_serial(self) -> int | None:
        value = self.fields.get(REPLY_SERIAL)
        return value if isinstance(value, int) else None

    @property
    def error_name(self) -> str:
        return str(self.fields.get(ERROR_NAME, ""))

    @property
    def sender(self) -> str:
        """The unique name of the connection that sent it, as the bus daemon stamps it."""
        return str(self.fields.get(SENDER, ""))


def _invalid(why: str) -> DriverError:
    return DriverError(f"malformed D-Bus message: {why}")


class _Writer:
    def __init__(self) -> None:
        self.data = bytearray()

    def align(self, size: int) -> None:
        self.data += bytes(-len(self.data) % size)

    def fixed(self, code: str, value: int) -> None:
        form, size = _FIXED[code]
        self.align(size)
        self.data += struct.pack(f"<{form}", value)

    def string(self, code: str, text: str) -> None:
        encoded = text.encode()
        if code == "g":
            self.data += bytes([len(encoded)]) + encoded + b"\0"
            return
        self.fixed("u", len(encoded))
        self.data += encoded + b"\0"


def method_call(
    serial: int, destination: str, path: str, interface: str, member: str, *arguments: str
) -> bytes:
    """A METHOD_CALL with string arguments (or none), little-endian."""
    body = _Writer()
    for argument in arguments:
        body.string("s", argument)
    fields = _Writer()
    fields.data += bytes(FIXED_HEADER)  # alignment counts from the start of the message
    values = [(PATH, path), (INTERFACE, interface), (MEMBER, member), (DESTINATION, destination)]
    if arguments:
        values.append((SIGNATURE, "s" * len(arguments)))
    for code, value in values:
        fields.align(8)
        fields.data += bytes([code])
        kind = _FIELD_TYPES[code]
        fields.string("g", kind)
        fields.string(kind, value)
    array = bytes(fields.data[FIXED_HEADER:])
    header = struct.pack("<cBBBIII", b"l", METHOD_CALL, 0, 1, len(body.data), serial, len(array))
    message = bytearray(header + array)
    message += bytes(-len(message) % 8)
    return bytes(message + body.data)


def message_length(fixed: bytes) -> int:
    """The whole length of the message whose first 16 bytes are ``fixed``, within the bound."""
    if len(fixed) < FIXED_HEADER or fixed[0] not in _ORDER:
        raise _invalid("no D-Bus header")
    order = _ORDER[fixed[0]]
    body, _, fields = struct.unpack_from(f"{order}III", fixed, 4)
    length = int(FIXED_HEADER + fields + (-(FIXED_HEADER + fields) % 8) + body)
    if length > MAX_MESSAGE:
        raise _invalid(f"{length} bytes, over the limit of {MAX_MESSAGE}")
    return length


def split_message(buffer: bytes) -> tuple[Message | None, bytes]:
    """The first whole message in what a stream has delivered, and what follows it; None (and
    the buffer as it is) while the message is not whole yet."""
    if len(buffer) < FIXED_HEADER:
        return None, buffer
    length = message_length(buffer[:FIXED_HEADER])
    if len(buffer) < length:
        return None, buffer
    return parse_message(buffer[:length]), buffer[length:]


class _Reader:
    def __init__(self, data: bytes, order: str, end: int) -> None:
        self.data, self.order, self.end, self.at = data, order, end, 0

    def align(self, size: int) -> None:
        self.take(-self.at % size)

    def take(self, count: int) -> bytes:
        if count < 0 or self.at + count > self.end:
            raise _invalid("a value runs past its end")
        chunk = self.data[self.at : self.at + count]
        self.at += count
        return chunk

    def value(self, code: str) -> Value:
        if code in _FIXED:
            form, size = _FIXED[code]
            self.align(size)
            (number,) = struct.unpack(f"{self.order}{form}", self.take(size))
            return bool(number) if code == "b" else number
        if code in {"s", "o", "g"}:
            length = self.take(1)[0] if code == "g" else int(self.value("u"))
            text = self.take(length)
            if self.take(1) != b"\0":
                raise _invalid("a string without its NUL")
            try:
                return text.decode()
            except UnicodeDecodeError:
                raise _invalid("a string that is not UTF-8") from None
        raise _invalid(f"type {code!r} is not a basic type this reader takes")


def parse_message(data: bytes) -> Message:
    """One whole message (:func:`message_length` bytes)."""
    length = message_length(data[:FIXED_HEADER])
    if len(data) != length:
        raise _invalid(f"{len(data)} bytes, its header says {length}")
    order = _ORDER[data[0]]
    kind, _, version, body_length, serial, fields_length = struct.unpack_from(
        f"{order}BBBIII", data, 1
    )
    if version != 1:
        raise _invalid(f"protocol version {version}")
    reader = _Reader(data, order, FIXED_HEADER + fields_length)
    reader.at = FIXED_HEADER
    fields: dict[int, Value] = {}
    while reader.at < reader.end:
        reader.align(8)
        code = reader.take(1)[0]
        signature = str(reader.value("g"))
        if len(signature) != 1:
            raise _invalid(f"header field {code} of type {signature!r}")
        fields[code] = reader.value(signature)
    signature = str(fields.get(SIGNATURE, ""))
    start = length - body_length
    body = _Reader(data, order, length)
    body.at = start  # at a multiple of 8, as every alignment divides 8
    values = tuple(body.value(code) for code in signature)
    if body.at != length:
        raise _invalid("the body is longer than its signature")
    return Message(kind, int(serial), fields, values)
