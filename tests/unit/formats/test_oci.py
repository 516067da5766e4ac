"""What formats/oci.py reads of a registry's answers."""

from __future__ import annotations

from nvidia_driver.formats.oci import retry_after


def test_a_retry_after_date_past_datetimes_years_is_no_date() -> None:
    # A server's header: email.utils raises OverflowError, not ValueError, for a year datetime
    # cannot hold, and the gate's and the tooling's retries must not break on it.
    assert retry_after("Fri, 31 Dec 99999999999 23:59:59 GMT") is None
