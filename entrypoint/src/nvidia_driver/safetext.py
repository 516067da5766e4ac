"""The one check of every name and value written to a config file, a command line or a log line.

What reads them reads lines: modprobe reads ``/etc/modprobe.d`` a line at a time and runs an
``install`` line's command as root; the fabric manager and IMEX read ``KEY=value`` lines;
operators and log collectors read the log a line at a time. A name or a value holding a line
break would start a line of its own there (``nvidia\\ninstall nvidia sh -c ...``). Readers
disagree on what breaks a line: Python's ``str.splitlines()`` breaks at ``\\n``, ``\\r``,
``\\v``, ``\\f``, ``\\x1c``-``\\x1e``, ``\\x85``, ``\\u2028`` and ``\\u2029``, modprobe at
``\\n`` alone, so ``4\\rFABRIC_MODE=1`` is one line to one and two to the other. That ambiguity
is refused: no name or value may hold a character of the categories Cc (controls, every line
break above but the last two), Zl and Zp (those two), Cf (invisible formatting, such as the
bidirectional overrides that make a log line read otherwise than it is) or Cs (lone
surrogates: undecodable bytes of a file name or a variable). Names must match their
consumer's grammar as well.

A refusal is one :class:`DriverError` line that shows the text with ``repr`` (which escapes
every such character) and says what to fix; callers check everything before writing anything.
Text the node cannot refuse (a server's status line, a host file, a name from the cluster)
goes into log lines, annotations and events through :func:`shown`, which escapes the same
characters and clips it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection

from nvidia_driver.errors import DriverError

UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
MAX_LENGTH = 4096  # any one name or value: a module parameter list, a fabric manager path

# The grammars of the consumers.
MODULE = re.compile(r"[a-z0-9_-]+")  # a kernel module, as modprobe.d's "options <module>" names it
PARAMETER = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")  # a module parameter's name
CONFIG_KEY = re.compile(r"[A-Z0-9_]+")  # KEY of the fabric manager's and IMEX's KEY=value
ADDRESS = re.compile(r"[0-9A-Za-z.:%_-]{1,253}")  # an IMEX node: IPv4, IPv6 or a host name
_SHOWN = 200  # characters of untrusted text a log line shows
# Characters of a node annotation or an event message (the reboot gate's verdict), and of
# anything the gate says: what an operator reads at a glance.
ANNOTATION_SHOWN = 400


def unsafe(text: str) -> str | None:
    """The first line break or control character in ``text``; None when it holds none."""
    return next((c for c in text if unicodedata.category(c) in UNSAFE_CATEGORIES), None)


def check(text: str, what: str, fix: str) -> str:
    """``text``, when it holds no line break or control character and is not too long.

    Refusals read ``<what> '<text>', which <problem>: <fix>``.
    """
    character = unsafe(text)
    if character is not None:
        kind = "a line break" if len(f"a{character}b".splitlines()) > 1 else "a control character"
        raise _refused(
            what, text, f"holds U+{ord(character):04X}, {kind} that would let it start a line of "
            "its own where it is written", fix
        )  # fmt: skip
    if len(text) > MAX_LENGTH:
        raise _refused(what, text, f"is over {MAX_LENGTH} characters", fix)
    return text


def check_name(text: str, grammar: re.Pattern[str], what: str, accepted: str, fix: str) -> str:
    """``text``, when it is safe (:func:`check`) and matches its consumer's ``grammar``."""
    if not grammar.fullmatch(check(text, what, fix)):
        raise _refused(what, text, f"is not {accepted}", fix)
    return text


def module_name(text: str, modules: Collection[str], what: str, fix: str) -> str:
    """A kernel module's name: ``[a-z0-9_-]+`` and one of ``modules`` (``_`` and ``-`` alike)."""
    check_name(text, MODULE, what, "a module name ([a-z0-9_-]+)", fix)
    if text.replace("_", "-") not in modules:
        raise _refused(
            what, text, f"is not one of the driver's modules ({', '.join(modules)})", fix
        )
    return text


def module_parameter(token: str, what: str, fix: str) -> str:
    """``name=value`` as modprobe.d's ``options`` line takes it: a name, and a value unbroken."""
    name, equals, value = check(token, what, fix).partition("=")
    if not (equals and PARAMETER.fullmatch(name)) or value.split() != [value]:
        raise _refused(what, token, "is not a module parameter (name=value)", fix)
    return token


def config_entry(key: str, value: str, what: str, fix: str) -> tuple[str, str]:
    """A ``KEY=value`` line of a daemon's config: a key of its grammar, a value on one line."""
    check_name(key, CONFIG_KEY, f"{what} name", "an option name (A-Z, 0-9 and _)", fix)
    return key, check(value, f"{what} {key}'s value", fix)


def shown(text: str, limit: int = _SHOWN) -> str:
    """Untrusted text (a server's words, a host file) fit for one log line: every line break
    and control character escaped, at most ``limit`` characters, a cut marked with "…" (never
    one through an escape)."""
    pieces: list[str] = []
    size = 0
    for character in text.strip():
        pieces.append(_escaped(character))
        size += len(pieces[-1])
        if size > limit:
            while size > limit - 1:
                size -= len(pieces.pop())
            return "".join(pieces) + "…"
    return "".join(pieces)


def _escaped(character: str) -> str:
    return character.encode("unicode_escape").decode("ascii") if unsafe(character) else character


def _refused(what: str, text: str, problem: str, fix: str) -> DriverError:
    return DriverError(f"{what} {_clip(text)!r}, which {problem}: {fix}")


def _clip(text: str) -> str:
    return text if len(text) <= _SHOWN else text[:_SHOWN]
