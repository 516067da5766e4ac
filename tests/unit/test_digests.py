"""The one SHA-256 check and digest-list reader the image build and the tooling share."""

from __future__ import annotations

import pytest

from nvidia_driver.digests import ANY, digest_list, valid_sha256
from nvidia_driver.errors import DriverError

ONE, TWO = "a" * 64, "b" * 64


def test_a_digest_is_64_hex_digits_in_lower_case() -> None:
    assert valid_sha256(f" {ONE.upper()}\n", "the .run") == ONE
    for bad in ("", "TODO", f"sha256:{ONE}", ONE[:-1], f"{ONE}0", "g" * 64):
        with pytest.raises(DriverError, match=r"^the \.run is not a SHA-256 \(64 hex digits\)"):
            valid_sha256(bad, "the .run")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("", {}),
        (ONE, {ANY: ONE}),
        (f"amd64={ONE}, arm64={TWO.upper()}", {"amd64": ONE, "arm64": TWO}),
        (f"fabricmanager.amd64={ONE},,nvlsm.arm64 = {TWO}", {"fabricmanager.amd64": ONE,
                                                            "nvlsm.arm64": TWO}),
    ],
)  # fmt: skip
def test_a_digest_list_is_one_digest_or_key_digest_pairs(
    spec: str, expected: dict[str, str]
) -> None:
    assert digest_list(spec, "--sha256") == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (f"{ONE},amd64={TWO}", f"--sha256 entry '{ONE}' is not KEY=<sha256>"),
        (f"={ONE}", f"--sha256 entry '={ONE}' is not KEY=<sha256>"),
        (f"amd64={ONE},arm64=TODO", "--sha256 arm64 is not a SHA-256 (64 hex digits): 'TODO'"),
    ],
)
def test_a_malformed_digest_list_is_refused_in_one_line(spec: str, message: str) -> None:
    with pytest.raises(DriverError) as raised:
        digest_list(spec, "--sha256")
    assert str(raised.value) == message
