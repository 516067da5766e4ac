"""A registry's answers, read one way: for the reboot gate (:mod:`nvidia_driver.gate.registry`,
over http.client) and the tooling (gdc.registry, over requests).

Each transport reads an answer as sent (never inflated) and bounded, then hands its headers
and bytes to these checks: manifests, blobs and configs against their digest, media type and
shape; digests and references before they become part of a URL or a path; where redirects,
token realms and credentials may go. Every failure is a DriverError of one line that begins
with what the caller names: the image.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import fnmatch
import hashlib
import json
import re
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nvidia_driver.digests import SHA256_HEX
from nvidia_driver.errors import DriverError
from nvidia_driver.formats import jsontext
from nvidia_driver.limits import MiB
from nvidia_driver.safetext import shown
from nvidia_driver.settings import REGISTRY_TOKEN_HOSTS

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
IMAGE_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
MANIFEST_TYPES = (*INDEX_TYPES, *IMAGE_TYPES)
ACCEPT = ", ".join(MANIFEST_TYPES)
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
OCI_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
GZIP_TYPES = frozenset({DOCKER_GZIP, OCI_GZIP})
ZSTD_LAYER = "application/vnd.oci.image.layer.v1.tar+zstd"
# Docker's other layer types, by their OCI names (an OCI manifest lists OCI types).
OCI_NAMES = {
    "application/vnd.docker.image.rootfs.diff.tar": "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip":
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
}  # fmt: skip

MAX_MANIFEST_BYTES = 4 * MiB  # manifests are a few KiB
MAX_CONFIG_BYTES = 4 * MiB
MAX_ANSWER_BYTES = 1 * MiB  # a token, an error
MAX_REDIRECTS = 3  # a blob's: registry -> storage (-> a signed URL)
REDIRECTS = frozenset({301, 302, 303, 307, 308})  # the statuses that name a Location

# The OCI distribution reference grammar (distribution/reference, regexp.go), which the GPU
# Operator parses an image with (ref.New): a host with an optional port, then path components
# of lower-case letters and digits joined by ".", "_", "__" or dashes; a tag of at most 128.
_DOMAIN = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN}(?:\.{_DOMAIN})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
REPOSITORY = re.compile(rf"(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
DIGEST = re.compile(f"sha256:{SHA256_HEX.pattern}")

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"  # where docker.io's API is
# A registry's own token service on another host of the same operator, trusted without
# REGISTRY_TOKEN_HOSTS: Docker Hub's API answers 401 with realm="https://auth.docker.io/token"
# (docs.docker.com/registry/spec/auth/token, "How to authenticate").
OWN_TOKEN_HOSTS = {DOCKER_HUB_API: frozenset({"auth.docker.io"})}
_DOCKER_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io")
_PLAIN_HTTP = frozenset({"127.0.0.1", "localhost", "::1"})
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")  # Go's StdEncoding, padded
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class Manifest:
    media_type: str
    body: bytes
    digest: str

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEX_TYPES

    def json(self) -> dict[str, Any]:
        document = json.loads(self.body)
        return document if isinstance(document, dict) else {}


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    @property
    def basic(self) -> str:
        """The ``Authorization`` header's value for a ``Basic`` challenge."""
        # surrogateescape: the bytes of an auth that is not UTF-8, as the kubelet sends them
        pair = f"{self.username}:{self.password}".encode(errors="surrogateescape")
        return "Basic " + base64.b64encode(pair).decode()


# --- digests and references ----------------------------------------------------------------


def digest_of(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def checked_digest(digest: str, what: str) -> str:
    """digest, if it is a SHA-256 digest (the only kind either client checks), before it
    becomes part of a URL or a path."""
    if not DIGEST.fullmatch(digest):
        raise DriverError(f"{what}: {shown(digest)!r} is not a sha256:<64 hex> digest: refused "
                          "before any request; only SHA-256 blobs and manifests are "
                          "read")  # fmt: skip
    return digest


def checked_reference(reference: str, what: str) -> str:
    """reference, if it is a tag or a digest (the OCI grammar's), before it becomes a path."""
    if not (TAG.fullmatch(reference) or DIGEST.fullmatch(reference)):
        raise DriverError(f"{what}: {shown(reference)!r} is not a tag nor a sha256:<64 hex> "
                          "digest: refused before any request")  # fmt: skip
    return reference


def verified(body: bytes, digest: str, what: str) -> bytes:
    """body, if its digest is digest."""
    found = digest_of(body)
    if found != digest:
        raise DriverError(f"{what} is {found}, not {digest}: it does not match its digest, "
                          "refused; the registry's copy is damaged or not what its manifest "
                          "names")  # fmt: skip
    return body


# --- answers ------------------------------------------------------------------------------


def check_identity(content_encoding: str, what: str) -> None:
    """Refuse an answer sent compressed though none was asked for: it is never inflated."""
    encoding = content_encoding.strip().lower()
    if encoding not in {"", "identity"}:
        raise DriverError(f"{what}: Content-Encoding {shown(encoding)}, though none was asked "
                          "for: refused, not inflated; check the registry or the proxy before "
                          "it")  # fmt: skip


def read_manifest(
    body: bytes, *, content_type: str, claimed: str, reference: str, what: str
) -> Manifest:
    """The manifest in body, once its digest, media type and shape are known good.
    ``claimed``: its Docker-Content-Digest; ``reference``: the tag or digest it was asked by."""
    digest = digest_of(body)
    if DIGEST.fullmatch(reference):
        verified(body, reference, what)
    if claimed and claimed != digest:
        raise DriverError(f"{what} is {digest}, though its Docker-Content-Digest "
                          f"{shown(claimed)} names another: refused; check the registry and "
                          "any cache before it")  # fmt: skip
    header = content_type.split(";", maxsplit=1)[0].strip()
    document = jsontext.parse(body, what, "check the registry, or the proxy before it")
    if not isinstance(document, dict):
        raise DriverError(f"{what} is not a JSON object: refused")
    declared = document.get("mediaType")
    media_type = declared if isinstance(declared, str) and declared else header
    if media_type not in MANIFEST_TYPES or header not in {"", media_type}:
        types = f"{shown(str(declared or ''))} (body), {shown(header)} (Content-Type)"
        raise DriverError(f"{what} is of media type {types}: refused; only Docker schema 2 and "
                          "OCI images and indexes are read")  # fmt: skip
    problem = _shape_problem(document, media_type in INDEX_TYPES)
    if problem:
        raise DriverError(f"{what}: its {problem}: refused")
    return Manifest(media_type, body, digest)


def _shape_problem(document: dict[str, Any], index: bool) -> str:
    """What in a manifest is not the JSON objects a reader takes it for; "" if nothing."""
    if not index and not isinstance(document.get("config"), dict):
        return "config is not a JSON object"
    key = "manifests" if index else "layers"
    listed = document.get(key)
    if not isinstance(listed, list) or not all(isinstance(entry, dict) for entry in listed):
        return f"{key} is not a list of JSON objects"
    return ""


def index_platforms(index: Manifest) -> frozenset[tuple[str, str]]:
    """(os, architecture) of each entry of a checked index that names a platform."""
    return frozenset(
        (str(platform.get("os")), str(platform.get("architecture")))
        for entry in index.json()["manifests"]
        if isinstance(platform := entry.get("platform"), dict)
    )


def config_digest(manifest: Manifest, what: str) -> str:
    """The digest of an image manifest's config blob."""
    descriptor = manifest.json().get("config")
    digest = descriptor.get("digest", "") if isinstance(descriptor, dict) else ""
    return checked_digest(str(digest), what)


def read_config(body: bytes, digest: str, what: str) -> dict[str, Any]:
    """The image config in body (os, architecture, labels), checked against its digest."""
    document = jsontext.parse(verified(body, digest, what), what)
    if not isinstance(document, dict):
        raise DriverError(f"{what} is not a JSON object: refused")
    return document


def error_detail(body: bytes) -> str:
    """`` (CODE: message)`` of the first error an OCI error body lists, or ""."""
    try:
        document = jsontext.parse(body, "an error")
    except DriverError:
        return ""
    errors = document.get("errors") if isinstance(document, dict) else None
    first = errors[0] if isinstance(errors, list) and errors else None
    if not isinstance(first, dict):
        return ""
    words = ": ".join(str(first[key]) for key in ("code", "message") if first.get(key))
    return f" ({shown(' '.join(words.split()))})" if words.strip() else ""


def token_of(body: bytes, what: str) -> tuple[str, int | None]:
    """A token endpoint's token, and the seconds it names for its life (None: none named)."""
    document = jsontext.parse(body, what)
    token = document.get("token") or document.get("access_token") if isinstance(
        document, dict) else None  # fmt: skip
    if not isinstance(token, str) or not token:
        raise DriverError(f"{what} returned no token")
    lifetime = document.get("expires_in")
    valid = isinstance(lifetime, int) and not isinstance(lifetime, bool) and lifetime > 0
    return token, lifetime if valid else None


def retry_after(value: str) -> float | None:
    """The seconds a ``Retry-After`` value asks for (RFC 9110: ASCII digits, or an HTTP date),
    never below 0; None when it is neither. Each client caps and defaults it its own way."""
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):  # a year past datetime's: OverflowError
        return None
    return max(0.0, when.timestamp() - time.time())


# --- where requests and credentials may go -------------------------------------------------


def plain_http(host: str) -> bool:
    """Whether a registry host (``127.0.0.1:5000``, ``[::1]:5000``) is spoken to in plain
    http: only on the loopback, so that credentials and layers never cross a network in clear."""
    return (urllib.parse.urlsplit(f"//{host}").hostname or "") in _PLAIN_HTTP


def api_host(host: str) -> str:
    """Where a registry host's API is: docker.io's is registry-1.docker.io (containerd
    ``remotes/docker/resolver.go`` ``DefaultHost``), every other host's is itself."""
    return DOCKER_HUB_API if host == DOCKER_HUB else host


def base_url(host: str) -> str:
    return f"{'http' if plain_http(host) else 'https'}://{host}"


def on_registry(url: str, host: str) -> bool:
    """Whether url is on the registry itself: the one place its credentials go."""
    return urllib.parse.urlsplit(url).netloc == host


def joined(url: str, location: str, what: str) -> str:
    """A ``Location`` (a redirect's, an upload's) read against url, the request's, if it is a
    URL. ``what`` names the answer that sent it."""
    try:
        target = urllib.parse.urljoin(url, location)
        urllib.parse.urlsplit(target)
    except ValueError:  # urllib.parse: a bracketed host that is no IPv6 address
        raise DriverError(f"{what} to {shown(location)}, which is not a URL; check the "
                          "registry") from None  # fmt: skip
    return target


def redirect_target(url: str, location: str, host: str, what: str) -> str:
    """Where a redirect from url to location leads, if it may be followed: https, or the
    registry itself (a loopback one speaks plain http). ``what`` names the request."""
    target = joined(url, location, what)
    if urllib.parse.urlsplit(target).scheme != "https" and not on_registry(target, host):
        raise DriverError(f"{what} to {shown(target)}: only https redirects are followed, and "
                          "this one is not https; check the registry")  # fmt: skip
    return target


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """A ``WWW-Authenticate`` header's scheme (lower-cased) and parameters:
    ``Bearer realm="...",service="...",scope="..."`` -> ``("bearer", {"realm": ...})``."""
    scheme, _, params = header.partition(" ")
    return scheme.lower(), dict(_CHALLENGE_PARAM.findall(params))


def token_url(challenge: Mapping[str, str], scope: str) -> str:
    """Where a Bearer challenge's token is asked for, as distribution's client asks
    (registry/client/auth/session.go, fetchTokenWithBasicAuth): the realm with its own query
    kept, the challenge's service when it names one, and its scope (else ``scope``)."""
    realm = urllib.parse.urlsplit(challenge["realm"])
    query = urllib.parse.parse_qsl(realm.query, keep_blank_values=True)
    if challenge.get("service"):
        query.append(("service", challenge["service"]))
    query.append(("scope", challenge.get("scope") or scope))
    return urllib.parse.urlunsplit(realm._replace(query=urllib.parse.urlencode(query)))


def token_hosts(env: Mapping[str, str]) -> frozenset[str]:
    """The token services' hosts the user trusts with credentials besides the registry's own
    (``REGISTRY_TOKEN_HOSTS``, comma-separated; Docker Hub's is built in: OWN_TOKEN_HOSTS)."""
    return frozenset(h.strip() for h in env.get(REGISTRY_TOKEN_HOSTS, "").split(",") if h.strip())


def check_realm(
    realm: str, host: str, *, credentials: bool, trusted: frozenset[str], what: str
) -> str:
    """realm, if it may be asked for a token (with credentials, when there are some)."""
    try:
        parts = urllib.parse.urlsplit(realm)
    except ValueError:  # urllib.parse: a bracketed host that is no IPv6 address
        parts = None
    loopback = parts is not None and plain_http(host) and plain_http(parts.netloc)
    own = urllib.parse.urlsplit(f"//{host}").hostname
    if parts is None:
        why = "it is not a URL"
    elif parts.scheme != "https" and not (parts.scheme == "http" and loopback):
        why = "it is not https"
    elif credentials and parts.hostname not in {own, *OWN_TOKEN_HOSTS.get(host, ()), *trusted}:
        why = "credentials go only to the registry's own host or one REGISTRY_TOKEN_HOSTS names"
    else:
        return realm
    raise DriverError(f"{what} named a token service, and this client refused the token realm "
                      f"{shown(realm)}: {why}; if it is the registry's own token service, add "
                      "its host to REGISTRY_TOKEN_HOSTS")  # fmt: skip


def credentials_from_docker_config(document: Mapping[str, Any]) -> dict[str, Credentials]:
    """host -> credentials from a docker config (``{"auths": {...}}``, or a .dockercfg's map),
    as the docker CLI picks them: by host, whatever path a key names.

    A host's own key (``ghcr.io``) wins over its URL forms (``https://ghcr.io``).
    """
    found: dict[str, Credentials] = {}
    entries = _docker_config_entries(document)
    for key, credentials in sorted(entries, key=lambda entry: "://" not in entry[0]):
        found[_registry_key(key)] = credentials  # a host's own key last: it wins
    return found


def kubelet_keyring(
    document: Any, what: str, *, dockercfg: bool = False
) -> list[tuple[str, Credentials]]:
    """A pull secret's (key, credentials) as the kubelet reads them (kubernetes v1.36
    pkg/credentialprovider/secrets/secrets.go): a .dockerconfigjson's ``auths`` (``dockercfg``:
    a .dockercfg, the map itself), by Go's encoding/json (a field matches its name in any case)
    and config.go's DockerConfigEntry.UnmarshalJSON. What those refuse fails the whole secret,
    and pkg/kubelet/images/image_manager.go then fails every pull of the pod: a DriverError,
    which names no contents. The key in the kubelet's form, ``host[:port][/path]``: scheme and a
    ``/v1/`` or ``/v2/`` path dropped (keyring.go, BasicDockerKeyring.Add); a key it cannot
    parse is left out, as the kubelet leaves it out; so is an entry without a username."""
    try:
        entries = [(key, _kubelet_entry(entry)) for key, entry in _auths(document, dockercfg)]
    except DriverError as exc:
        raise DriverError(f"{what}: {exc}: the kubelet refuses the whole secret and fails every "
                          "pull of a pod that names it; correct the secret") from None  # fmt: skip
    keyring: list[tuple[str, Credentials]] = []
    for key, credentials in entries:
        try:
            parts = urllib.parse.urlsplit(key if key.startswith(("https://", "http://"))
                                          else f"https://{key}")  # fmt: skip
        except ValueError:
            continue
        path = parts.path[3:] if parts.path.startswith(("/v1/", "/v2/")) else parts.path
        if credentials.username:
            keyring.append((parts.netloc + ("" if path == "/" else path), credentials))
    return keyring


def _auths(document: Any, dockercfg: bool) -> list[tuple[str, Any]]:
    """The entries of a .dockercfg, or of a .dockerconfigjson's ``auths`` (config.go,
    DockerConfigJSON: its ``HttpHeaders`` must be strings too)."""
    auths = _go_object(document, "it")
    if not dockercfg:
        headers = _go_object(_go_field(auths, "HttpHeaders"), "its HttpHeaders")
        if not all(isinstance(value, (str, type(None))) for value in headers.values()):
            raise DriverError("its HttpHeaders is not a map of strings")
        auths = _go_object(_go_field(auths, "auths"), "its auths")
    return list(auths.items())


def _kubelet_entry(entry: Any) -> Credentials:
    """config.go's DockerConfigEntry.UnmarshalJSON: username and password, or an ``auth`` of
    base64 (StdEncoding if it ends in ``=``, else RawStdEncoding) of ``username:password``."""
    fields = _go_object(entry, "an entry")
    _go_string(fields, "email")  # read, and so checked, though no registry is sent it
    username, password, auth = (_go_string(fields, name) for name in ("username", "password",
                                                                       "auth"))  # fmt: skip
    if not auth:
        return Credentials(username, password)
    text = auth.replace("\r", "").replace("\n", "")  # Go's base64 skips line breaks
    # Go reads one not ending in "=" with RawStdEncoding (unpadded): padded here; one with an
    # "=" elsewhere fails below, as there.
    if "=" not in text:
        text += "=" * (-len(text) % 4)
    if len(text) % 4 or not _BASE64.fullmatch(text):
        raise DriverError("an auth that is not base64")
    decoded = binascii.a2b_base64(text)
    username, colon, password = decoded.decode("utf-8", "surrogateescape").partition(":")
    if not colon:
        raise DriverError("an auth that is not base64(username:password)")
    return Credentials(username, password)


def _go_object(value: Any, what: str) -> Mapping[str, Any]:
    """A JSON object as encoding/json reads one into a struct or a map: null is empty."""
    if value is not None and not isinstance(value, Mapping):
        raise DriverError(f"{what} is not a JSON object")
    return value or {}


def _go_field(document: Mapping[str, Any], name: str) -> Any:
    """A struct field as encoding/json fills it: the last key that is its name in any case."""
    found = [value for key, value in document.items() if key.lower() == name.lower()]
    return found[-1] if found else None


def _go_string(document: Mapping[str, Any], name: str) -> str:
    value = _go_field(document, name)
    if value is not None and not isinstance(value, str):
        raise DriverError(f"its {name} is not a JSON string")
    return value or ""


def kubelet_credentials(
    keyring: Sequence[tuple[str, Credentials]], repository: str
) -> list[Credentials]:
    """The credentials the kubelet tries, in this order, to pull ``repository``
    (``host[:port]/name``) with a pull secret's keyring (keyring.go, Lookup): those of every
    key that matches, the most specific (reverse-sorted) first; for Docker Hub, when none
    matches, ``index.docker.io``'s. None: the kubelet pulls anonymously."""
    ordered = sorted(keyring, key=lambda entry: entry[0], reverse=True)
    found = [credentials for key, credentials in ordered if _key_matches(key, repository)]
    if not found and repository.startswith(f"{DOCKER_HUB}/"):
        found = [credentials for key, credentials in ordered if key == "index.docker.io"]
    return list(dict.fromkeys(found))  # the same credentials are tried once


def _key_matches(key: str, repository: str) -> bool:
    """keyring.go's URLsMatch: the same port, as many dot-separated host parts, each matching
    the key's glob (``*.example.com``), and the key's path a prefix of the repository's."""
    (key_host, key_port, key_path), (host, port, path) = map(_host_port_path, (key, repository))
    return (key_port == port and len(key_host) == len(host) and path.startswith(key_path)
            and all(map(fnmatch.fnmatchcase, host, key_host)))  # fmt: skip


def _host_port_path(location: str) -> tuple[list[str], str, str]:
    """``reg.example.com:5000/o/driver`` -> (``["reg", "example", "com"]``, ``5000``,
    ``/o/driver``), as Go's net.SplitHostPort splits the host (keyring.go, splitURL)."""
    netloc, slash, path = location.partition("/")
    host, colon, port = netloc.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif not colon or ":" in host:  # no port, or an IPv6 address without one
        host, port = netloc, ""
    return host.split("."), port, slash + path


def _docker_config_entries(document: Mapping[str, Any]) -> list[tuple[str, Credentials]]:
    """(key as written, credentials) of every usable entry of a docker config."""
    auths = document.get("auths", document)
    if not isinstance(auths, Mapping):
        return []
    entries: list[tuple[str, Credentials]] = []
    for key, entry in auths.items():
        if not isinstance(key, str) or not isinstance(entry, Mapping):
            continue
        username, password = entry.get("username"), entry.get("password")
        encoded = entry.get("auth")
        if isinstance(encoded, str) and encoded:
            try:
                username, _, password = base64.b64decode(encoded).decode().partition(":")
            except ValueError:  # binascii.Error, UnicodeDecodeError, or text not ASCII
                continue
        if isinstance(username, str) and isinstance(password, str) and username:
            entries.append((key, Credentials(username, password)))
    return entries


def _registry_key(key: str) -> str:
    """``https://ghcr.io/v1/`` -> ``ghcr.io``; Docker Hub's keys -> ``docker.io``."""
    if key in _DOCKER_HUB_KEYS:
        return DOCKER_HUB
    parsed = urllib.parse.urlsplit(key if "://" in key else f"//{key}")
    return parsed.netloc or key
