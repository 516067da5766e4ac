"""What formats/oci.py reads of a registry's answers."""

from __future__ import annotations

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


def test_a_pull_secret_entry_whose_auth_is_not_ascii_is_left_out() -> None:
    # base64.b64decode raises a plain ValueError for non-ASCII text, not binascii.Error: the
    # entry is left out, as one whose auth is not base64 is.
    auths = {"ghcr.io": {"auth": "dTpw\u00e9"}, "quay.io": {"username": "q", "password": "w"}}
    assert kubelet_keyring({"auths": auths}) == [("quay.io", Credentials("q", "w"))]
