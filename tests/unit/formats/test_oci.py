"""What formats/oci.py reads of a registry's answers."""

from __future__ import annotations

import base64

import pytest

from nvidia_driver.errors import DriverError
from nvidia_driver.formats.oci import (
    Credentials,
    check_realm,
    kubelet_keyring,
    redirect_target,
    retry_after,
)


def test_a_retry_after_date_past_datetimes_years_is_no_date() -> None:
    # A server's header: email.utils raises OverflowError, not ValueError, for a year datetime
    # cannot hold, and the gate's and the tooling's retries must not break on it.
    assert retry_after("Fri, 31 Dec 99999999999 23:59:59 GMT") is None


@pytest.mark.parametrize("location", ["https://[storage.example/blob", "//[::1/blob"])
def test_a_redirect_to_what_is_no_url_is_refused_in_one_line(location: str) -> None:
    # urllib.parse raises ValueError for a bracketed host that is no IPv6 address.
    with pytest.raises(DriverError, match=r"^the blob to .*, which is not a URL; check the regis"):
        redirect_target("https://r.example/v2/x/blobs/sha256:0", location, "r.example", "the blob")


def test_a_token_realm_that_is_no_url_is_refused_in_one_line() -> None:
    with pytest.raises(DriverError, match=r"the token realm https://\[auth/token: it is not a URL"):
        check_realm("https://[auth/token", "r.example", credentials=False, trusted=frozenset(),
                    what="the registry")  # fmt: skip


def _auths(**entries: object) -> dict[str, object]:
    return {"auths": {"quay.io": {"username": "q", "password": "w"}, **entries}}


@pytest.mark.parametrize(
    ("document", "why"),
    [
        # config.go, decodeDockerConfigFieldAuth: base64 (padded or not), then user:password.
        (_auths(ghcr={"auth": "!!"}), "an auth that is not base64"),
        (_auths(ghcr={"auth": "dTpw\u00e9"}), "an auth that is not base64"),  # not ASCII
        (_auths(ghcr={"auth": "dTpw=="}), "an auth that is not base64"),  # padded wrongly
        (_auths(ghcr={"auth": "dXNlcg=="}), r"an auth that is not base64\(username:password\)"),
        # encoding/json: a field or an entry of another type fails the whole unmarshal.
        (_auths(ghcr={"password": 5}), "its password is not a JSON string"),
        (_auths(ghcr={"Auth": 5}), "its auth is not a JSON string"),  # fields match any case
        (_auths(ghcr="robot:s3cret"), "an entry is not a JSON object"),
        ({"auths": ["ghcr.io"]}, "its auths is not a JSON object"),
        ({"auths": {}, "HttpHeaders": {"X-A": 1}}, "its HttpHeaders is not a map of strings"),
        (["ghcr.io"], "it is not a JSON object"),
    ],
)
def test_a_pull_secret_the_kubelet_cannot_read_is_refused_whole_naming_no_contents(
    document: object, why: str
) -> None:
    """kubernetes v1.36 pkg/credentialprovider/secrets/secrets.go: json.Unmarshal into
    DockerConfigJSON fails for the whole secret (DockerConfigEntry.UnmarshalJSON, config.go),
    and pkg/kubelet/images/image_manager.go then fails every pull of the pod: no credentials
    of the secret, nor anonymous access, are what the kubelet pulls with."""
    with pytest.raises(DriverError, match=rf"^pull secret ns/s: {why}: the kubelet refuses") as e:
        kubelet_keyring(document, "pull secret ns/s")
    assert "s3cret" not in str(e.value)
    assert "robot" not in str(e.value)


def test_a_pull_secret_is_read_as_the_kubelet_reads_it() -> None:
    unpadded = base64.b64encode(b"u:p\xff").decode().rstrip("=")  # RawStdEncoding; any bytes
    auths = {"ghcr.io": {"AUTH": unpadded}, "empty.example": None, "quay.io": {"username": "q"}}
    keyring = kubelet_keyring({"Auths": auths}, "pull secret ns/s")
    assert keyring == [("ghcr.io", Credentials("u", "p\udcff")), ("quay.io", Credentials("q", ""))]
    assert keyring[0][1].basic == "Basic " + base64.b64encode(b"u:p\xff").decode()
    # A .dockerconfigjson is read by its auths only; a .dockercfg is the map itself.
    assert kubelet_keyring(auths, "pull secret ns/s") == []
    assert kubelet_keyring(auths, "pull secret ns/s", dockercfg=True) == keyring
