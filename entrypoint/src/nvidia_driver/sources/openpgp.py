"""Checking detached OpenPGP signatures with ``gpgv``, and the little OpenPGP parsing it needs.

A signature counts only when ``gpgv`` (run with ``--status-fd``) reports it valid, it is not by
a revoked key, its digest is not SHA1 (``--weak-digest SHA1``), and the primary key VALIDSIG
names is the pinned one (when a primary is pinned). Whether a signature by a subkey that has
expired since still counts is decided by the caller (see ``verify.py``), which knows when the
subkey expired: gpgv accepts it either way, and its KEYEXPIRED lines name no key.

The signature file itself is read only for what decides whether to refresh the keyring before
a download: its creation time and its issuer. Nothing here trusts those fields.
"""

from __future__ import annotations

import base64
import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_ARMOR_BEGIN = "-----BEGIN PGP "
_ARMOR_KEY = "-----BEGIN PGP PUBLIC KEY BLOCK-----"
_CRC24_INIT = 0xB704CE
_CRC24_POLY = 0x1864CFB
_STATUS = "[GNUPG:]"
# gpgv status lines that refuse a signature, most specific first (NO_PUBKEY comes with ERRSIG).
_REFUSALS = (
    ("BADSIG", "BAD signature: the file is not what was signed"),
    ("REVKEYSIG", "signed by a revoked key"),
    ("NO_PUBKEY", "signed by a key that is not in the keyring"),
)
# ERRSIG's return code (its sixth field), as gpg's doc/DETAILS lists them; 39 is libgpg-error's
# GPG_ERR_TIME_CONFLICT, which gnupg's g10/sig-check.c returns for a key made after the
# signature or after the clock ("created ... in the future (time warp or clock problem)").
_ERRSIG_REASONS = {
    "4": "the signature uses an unsupported algorithm",
    "5": "the signature uses a weak or unknown digest algorithm (SHA1 signatures are refused)",
    "9": "signed by a key that is not in the keyring",
    "39": "the signing key is dated after the signature or after the node's clock (gpg: time "
    "conflict): check the node's clock",
}
_ERRSIG_REASON_FIELD = 6
_VALIDSIG_CREATED_FIELD = 3
_VALIDSIG_PRIMARY_FIELD = 10
_SIGNATURE_TAG = 2
_CREATION_TIME_SUBPACKET = 2
_ISSUER_SUBPACKET = 16
_ISSUER_FINGERPRINT_SUBPACKET = 33
_DIGITS = re.compile("[0-9]+")
_SIGNATURE_VERSIONS = (4, 5)


@dataclass(frozen=True)
class Verdict:
    """What gpgv said about one signature."""

    problem: str | None  # why it does not count; None when it may
    signer: str | None = None  # VALIDSIG: the signing (sub)key's fingerprint
    created: int | None = None  # VALIDSIG: when the signature was made


@dataclass(frozen=True)
class SignatureInfo:
    """What a signature packet says of itself (unverified)."""

    created: int | None
    issuer_fingerprint: str | None
    issuer_key_id: str | None

    def issued_by(self, fingerprint: str) -> bool:
        fingerprint = fingerprint.upper()
        if self.issuer_fingerprint is not None:
            return self.issuer_fingerprint == fingerprint
        return self.issuer_key_id is not None and fingerprint.endswith(self.issuer_key_id)


def gpgv_args(keyrings: Sequence[Path], signature: Path, data: Path) -> list[str]:
    keyring_args = [arg for keyring in keyrings for arg in ("--keyring", str(keyring))]
    return [
        "--status-fd", "1", "--weak-digest", "SHA1", *keyring_args, str(signature), str(data)
    ]  # fmt: skip


def gpgv_env(home: Path) -> dict[str, str]:
    # A private, throw-away home: gpgv never reads or writes the user's ~/.gnupg.
    return {"GNUPGHOME": str(home)}


def verdict(returncode: int, output: str, primary: str | None = None) -> Verdict:
    """What gpgv's output (with ``--status-fd``) says; ``primary`` pins VALIDSIG's primary."""
    statuses = _statuses(output)
    found = {words[0] for words in statuses}
    for status, reason in _REFUSALS:
        if status in found:
            return Verdict(reason)
    for words in statuses:
        if words[0] == "ERRSIG":
            code = _field(words, _ERRSIG_REASON_FIELD)
            reason = _ERRSIG_REASONS.get(code, f"the signature cannot be checked (ERRSIG {code})")
            return Verdict(reason)
    valid = [words for words in statuses if words[0] == "VALIDSIG"]
    if returncode != 0 or not valid:
        messages = [line.strip() for line in output.splitlines() if not line.startswith(_STATUS)]
        return Verdict(next((line for line in messages if line), f"gpgv exited with {returncode}"))
    named = _field(valid[0], _VALIDSIG_PRIMARY_FIELD).upper()
    if primary is not None and named != primary.upper():
        return Verdict(
            f"signed by a key whose primary is {named or 'not named'}, not the pinned {primary}"
        )
    return Verdict(
        None,
        signer=_field(valid[0], 1).upper() or None,
        created=_timestamp(_field(valid[0], _VALIDSIG_CREATED_FIELD)),
    )


def signature_info(data: bytes) -> SignatureInfo:
    """The creation time and issuer of the first signature in a binary or armored file."""
    try:
        packets = dearmor(data.decode("ascii")) if data.startswith(b"-----") else data
        body = _first_packet(packets, _SIGNATURE_TAG)
        if body is not None:
            return _signature_fields(body)
    except (ValueError, IndexError, UnicodeDecodeError):
        pass
    return SignatureInfo(None, None, None)


def dearmor(text: str) -> bytes:
    """The binary packets of the ASCII-armored blocks in ``text`` (gpgv 2.2 reads only binary)."""
    packets = b""
    rest = text
    while _ARMOR_BEGIN in rest:
        block = rest.split(_ARMOR_BEGIN, 1)[1]
        header, _, block = block.partition("-----")
        end = f"-----END PGP {header}-----"
        block, found_end, rest = block.partition(end)
        if not found_end:
            raise ValueError("unterminated armored block")
        packets += _decode_armored_block(block)
    if not packets:
        raise ValueError("no armored public key block")
    return packets


def is_armored_key(content: bytes) -> bool:
    return _ARMOR_KEY.encode() in content


def _statuses(output: str) -> list[list[str]]:
    return [
        words[1:]
        for words in map(str.split, output.splitlines())
        if len(words) > 1 and words[0] == _STATUS
    ]


def _timestamp(field: str) -> int | None:
    """A status-line time: seconds since the epoch, or ISO 8601 as ``20260301T120000``."""
    if _DIGITS.fullmatch(field):
        return int(field)
    try:
        parsed = dt.datetime.strptime(field, "%Y%m%dT%H%M%S").replace(tzinfo=dt.UTC)
    except ValueError:
        return None
    return int(parsed.timestamp())


def _field(words: list[str], index: int) -> str:
    return words[index] if len(words) > index else ""


def _first_packet(data: bytes, wanted: int) -> bytes | None:
    """The body of the first packet of type ``wanted`` (RFC 4880, section 4.2)."""
    offset = 0
    while offset < len(data):
        tag, start, length = _packet_header(data, offset)
        body = data[start : start + length]
        if len(body) < length:
            raise ValueError("truncated packet")
        if tag == wanted:
            return body
        offset = start + length
    return None


def _packet_header(data: bytes, offset: int) -> tuple[int, int, int]:
    first = data[offset]
    if not first & 0x80:
        raise ValueError("not an OpenPGP packet")
    if first & 0x40:  # new format
        length, octets = _length(data, offset + 1, packet=True)
        return first & 0x3F, offset + 1 + octets, length
    tag, kind = (first >> 2) & 0x0F, first & 0x03
    size = (1, 2, 4)[kind] if kind < 3 else None  # noqa: PLR2004
    if size is None:
        return tag, offset + 1, len(data) - offset - 1
    start = offset + 1 + size
    return tag, start, int.from_bytes(data[offset + 1 : start])


def _length(data: bytes, offset: int, *, packet: bool) -> tuple[int, int]:
    """A length as a new-format packet (RFC 4880, section 4.2.2) or a subpacket (5.2.3.1)
    writes it at ``offset``, and the octets it takes."""
    octet = data[offset]
    if octet < 192:  # noqa: PLR2004 - RFC 4880 length encodings
        return octet, 1
    if octet < (224 if packet else 255):
        return ((octet - 192) << 8) + data[offset + 1] + 192, 2
    if octet == 255:  # noqa: PLR2004
        return int.from_bytes(data[offset + 1 : offset + 5]), 5
    raise ValueError("partial body lengths are not used by signatures")


def _signature_fields(body: bytes) -> SignatureInfo:
    version = body[0]
    if version in (2, 3):  # fixed layout: length 5, class, time, then the issuer's key id
        return SignatureInfo(int.from_bytes(body[3:7]), None, body[7:15].hex().upper())
    if version not in _SIGNATURE_VERSIONS:
        return SignatureInfo(None, None, None)
    hashed_end = 6 + int.from_bytes(body[4:6])
    unhashed_end = hashed_end + 2 + int.from_bytes(body[hashed_end : hashed_end + 2])
    # The hashed area first: what the signer committed to wins over the unhashed one.
    subpackets = {
        **dict(_subpackets(body[hashed_end + 2 : unhashed_end])),
        **dict(_subpackets(body[6:hashed_end])),
    }
    created = subpackets.get(_CREATION_TIME_SUBPACKET)
    fingerprint = subpackets.get(_ISSUER_FINGERPRINT_SUBPACKET)
    key_id = subpackets.get(_ISSUER_SUBPACKET)
    return SignatureInfo(
        int.from_bytes(created) if created is not None and len(created) == 4 else None,  # noqa: PLR2004
        fingerprint[1:].hex().upper() if fingerprint else None,
        key_id.hex().upper() if key_id is not None and len(key_id) == 8 else None,  # noqa: PLR2004
    )


def _subpackets(area: bytes) -> list[tuple[int, bytes]]:
    found = []
    offset = 0
    while offset < len(area):
        length, size = _length(area, offset, packet=False)
        offset += size
        if length == 0 or offset + length > len(area):
            raise ValueError("bad subpacket length")
        found.append((area[offset] & 0x7F, area[offset + 1 : offset + length]))
        offset += length
    return found


def _decode_armored_block(block: str) -> bytes:
    # Base64 has no ':' (armor headers do) and '=' only ends a line (the checksum starts one).
    stripped = [line.strip() for line in block.splitlines()]
    body = "".join(line for line in stripped if ":" not in line and not line.startswith("="))
    packets = base64.b64decode(body, validate=True)
    checksums = [line[1:] for line in stripped if line.startswith("=")]
    if checksums and base64.b64decode(checksums[0]) != _crc24(packets).to_bytes(3, "big"):
        raise ValueError("armor checksum mismatch: the key text is damaged")
    return packets


def _crc24(data: bytes) -> int:
    """The OpenPGP armor checksum (RFC 4880, section 6.1)."""
    crc = _CRC24_INIT
    for byte in data:
        crc ^= byte << 16
        for _ in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= _CRC24_POLY
    return crc & 0xFFFFFF
