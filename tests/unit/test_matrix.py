"""invoke matrix: which releases, drivers and arches get images, and what is left out and why."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flatcar_feed import feed_entry, feed_from_tsv, with_markers

from gdc import matrix
from gdc.releases import ReleaseError
from gdc.tags import Variant
from gdc.versions import Versions, load_versions, parse_versions

SUM = "ab" * 32


def _versions(*drivers: str, channels: tuple[str, ...] = ("stable", "beta", "alpha", "lts"),
              pinned: tuple[str, ...] = (), arches: tuple[str, ...] = ("amd64", "arm64")) -> (
    Versions
):  # fmt: skip
    return parse_versions({
        "images": {"channels": list(channels), "arches": list(arches), "pinned": list(pinned)},
        "drivers": {version: {"sha256": {"amd64": SUM}} for version in drivers or ["610.57.04"]},
    })  # fmt: skip


def _text(feed: dict[str, Any]) -> str:
    return json.dumps(feed)


def _covered(feed: dict[str, Any], versions: Versions) -> dict[str, tuple[str, ...]]:
    covered, _ = matrix.covered_releases(_text(feed), versions)
    return {c.version: c.streams for c in covered}


def test_the_current_release_of_every_channel_and_lts_stream() -> None:
    assert _covered(feed_from_tsv(), _versions()) == {
        "4081.3.10": ("lts-2024",),
        "4593.2.5": ("stable",),
        "4757.1.0": ("beta",),
        "4790.0.0": ("alpha",),
    }


def test_only_the_channels_versions_toml_lists() -> None:
    assert _covered(feed_from_tsv(), _versions(channels=("stable", "lts"))) == {
        "4081.3.10": ("lts-2024",),
        "4593.2.5": ("stable",),
    }


def test_the_repository_s_versions_file_covers_all_four_channels() -> None:
    covered = _covered(feed_from_tsv(), load_versions())
    assert set(covered) == {"4081.3.10", "4593.2.5", "4757.1.0", "4790.0.0"}


def test_pinned_releases_are_covered_too() -> None:
    covered = _covered(feed_from_tsv(), _versions(pinned=("4593.2.0", "4593.2.5")))
    assert covered["4593.2.0"] == ("pinned",)
    assert covered["4593.2.5"] == ("stable", "pinned")


def test_an_lts_stream_with_no_release_for_months_is_no_longer_maintained() -> None:
    feed = feed_from_tsv()
    feed["3510.3.8"] = feed_entry("lts", "2025-06-30", "5.15.185")
    feed["current-2023"] = feed["3510.3.8"]
    covered, excluded = matrix.covered_releases(_text(feed), _versions())
    assert "3510.3.8" not in {c.version for c in covered}
    [exclusion] = excluded
    assert exclusion.flatcar == "3510.3.8"
    assert exclusion.reason.startswith("lts-2023's newest release is from 2025-06-30, 409 days")
    assert "pin the release in versions.toml" in exclusion.reason
    pinned = _covered(feed, _versions(pinned=("3510.3.8",)))
    assert pinned["3510.3.8"] == ("pinned",)


def test_a_current_release_without_a_kernel_is_excluded_not_replaced() -> None:
    feed = feed_from_tsv()
    feed["4790.0.1"] = feed_entry("alpha", "2026-08-20", None)
    feed["4593.2.6"] = feed_entry("stable", "2026-08-20", None)
    feed = with_markers(feed)  # current now copies 4593.2.6, kernel and all
    covered, excluded = matrix.covered_releases(_text(feed), _versions())
    assert {c.version for c in covered} == {"4081.3.10", "4757.1.0"}
    assert [(x.flatcar, x.driver, x.arch) for x in excluded] == [
        ("4790.0.1", "*", "*"),
        ("4593.2.6", "*", "*"),
    ]
    assert excluded[0].reason == (
        "Flatcar 4790.0.1 (alpha) has no kernel in the releases feed (major_software.kernel): "
        "nothing is built or tagged for it until the feed lists one; re-run later"
    )


def test_an_old_release_without_a_kernel_does_not_matter() -> None:
    feed = feed_from_tsv()
    feed["4593.0.0"] = feed_entry("alpha", "2026-01-27", None)
    covered, excluded = matrix.covered_releases(_text(feed), _versions())
    assert len(covered) == 4
    assert excluded == ()


def test_a_pinned_release_missing_from_the_feed_or_its_kernel_is_excluded() -> None:
    feed = feed_from_tsv()
    feed["4628.1.3"] = feed_entry("beta", "2026-06-01", None)
    _, excluded = matrix.covered_releases(_text(feed), _versions(pinned=("4628.1.3", "1.2.3")))
    assert [x.flatcar for x in excluded] == ["4628.1.3", "1.2.3"]
    assert "(pinned) has no kernel" in excluded[0].reason
    assert excluded[1].reason == (
        "Flatcar 1.2.3 is pinned in versions.toml but not in the releases feed: check the version"
    )


def test_entries_cross_drivers_releases_and_arches() -> None:
    versions = _versions("580.178.04", "610.57.04", channels=("stable", "lts"))
    built = matrix.build_matrix(_text(feed_from_tsv()), versions, registry="ghcr.io/me")
    assert [entry.id for entry in built.entries] == [
        "build-580.178.04-amd64",
        "build-580.178.04-arm64",
        "precompiled-580.178.04-4081.3.10-amd64",
        "precompiled-580.178.04-4081.3.10-arm64",
        "precompiled-580.178.04-4593.2.5-amd64",
        "precompiled-580.178.04-4593.2.5-arm64",
        "build-610.57.04-amd64",
        "build-610.57.04-arm64",
        "precompiled-610.57.04-4081.3.10-amd64",
        "precompiled-610.57.04-4081.3.10-arm64",
        "precompiled-610.57.04-4593.2.5-amd64",
        "precompiled-610.57.04-4593.2.5-arm64",
    ]
    build, precompiled = built.entries[6], built.entries[10]
    assert build.tags.references == (
        "ghcr.io/me/driver:610.57.04-flatcar",
        "ghcr.io/me/driver:610.57.04-flatcar-flatcar4081.3.10",
        "ghcr.io/me/driver:610.57.04-flatcar-flatcar4593.2.5",
    )
    assert precompiled.variant is Variant.PRECOMPILED
    assert precompiled.tags.tags == (
        "610.57.04-flatcar4593.2.5",
        "610-6.12.102-flatcar-flatcar4593.2.5",
    )


def test_a_branch_a_kernel_broke_is_excluded_unless_a_patch_fixes_it() -> None:
    """535 and 570 ship the pci_resize_resource patch, 560 has none, 580 needs none."""
    versions = _versions("535.261.03", "560.35.03", "570.195.03", "580.178.04")
    built = matrix.build_matrix(_text(feed_from_tsv()), versions)
    excluded = [(x.driver, x.flatcar) for x in built.excluded]
    assert excluded == [("560.35.03", "4593.2.5"), ("560.35.03", "4757.1.0"),
                        ("560.35.03", "4790.0.0")]  # fmt: skip
    reason = built.excluded[0].reason
    assert reason.startswith(
        "driver 560.35.03 kernel-open does not build on kernel 6.12.102-flatcar: it needs patch "
        "pci-resize-resource-exclude-bars (kernels from 6.12.97; fixed by NVIDIA from branch 580)"
    )
    assert "patches/index.json has none for branch 560" in reason
    build_560 = next(e for e in built.entries if e.id == "build-560.35.03-amd64")
    assert build_560.aliases == ("4081.3.10",)  # LTS 4081 runs 6.6: unaffected
    assert {e.release.version for e in built.entries
            if e.driver.version == "570.195.03" and e.release} == {
        "4081.3.10", "4593.2.5", "4757.1.0", "4790.0.0"}  # fmt: skip


def test_a_release_not_built_for_an_arch_gets_no_image_for_it() -> None:
    feed = feed_from_tsv()
    feed["4790.0.0"]["architectures"] = ["amd64"]
    feed = with_markers(feed)
    built = matrix.build_matrix(_text(feed), _versions(channels=("alpha",)))
    assert [e.id for e in built.entries] == [
        "build-610.57.04-amd64", "build-610.57.04-arm64", "precompiled-610.57.04-4790.0.0-amd64"
    ]  # fmt: skip
    [exclusion] = built.excluded
    assert (exclusion.variant, exclusion.arch) == ("precompiled", "arm64")
    assert exclusion.reason == "Flatcar 4790.0.0 is not released for arm64"


def test_no_release_covered_means_no_image() -> None:
    feed = with_markers({"4790.0.1": feed_entry("alpha", "2026-08-20", None)})
    built = matrix.build_matrix(_text(feed), _versions())
    assert built.entries == ()
    assert [x.flatcar for x in built.excluded] == ["4790.0.1"]


def test_the_json_is_one_line_of_include_entries_with_the_same_keys() -> None:
    versions = _versions(channels=("stable",), arches=("amd64",))
    text = matrix.to_json(matrix.build_matrix(_text(feed_from_tsv()), versions, prefix="t"))
    assert "\n" not in text
    document = json.loads(text)
    assert set(document) == {"include", "excluded", "releases", "drivers"}
    assert document["drivers"] == ["610.57.04"]
    build, precompiled = document["include"]
    assert build == {
        "id": "build-610.57.04-amd64", "variant": "build", "driver": "610.57.04",
        "branch": "610", "arch": "amd64", "flatcar": "", "channel": "", "streams": [],
        "kernel": "", "aliases": ["4593.2.5"], "repository": "driver",
        "tags": ["t-610.57.04-flatcar", "t-610.57.04-flatcar-flatcar4593.2.5"],
    }  # fmt: skip
    assert precompiled == {
        "id": "precompiled-610.57.04-4593.2.5-amd64", "variant": "precompiled",
        "driver": "610.57.04", "branch": "610", "arch": "amd64", "flatcar": "4593.2.5",
        "channel": "stable", "streams": ["stable"], "kernel": "6.12.102-flatcar",
        "aliases": [], "repository": "driver",
        "tags": ["t-610.57.04-flatcar4593.2.5", "t-610-6.12.102-flatcar-flatcar4593.2.5"],
    }  # fmt: skip
    assert document["releases"] == [
        {"flatcar": "4593.2.5", "channel": "stable", "streams": ["stable"],
         "kernel": "6.12.102-flatcar"}
    ]  # fmt: skip
    assert document["excluded"] == []


def test_the_json_lists_exclusions_with_their_reasons() -> None:
    feed = feed_from_tsv()
    feed["4790.0.1"] = feed_entry("alpha", "2026-08-20", None)
    document = json.loads(matrix.to_json(matrix.build_matrix(_text(feed), _versions())))
    [excluded] = document["excluded"]
    assert set(excluded) == {"variant", "driver", "flatcar", "arch", "reason"}
    assert excluded["flatcar"] == "4790.0.1"


def test_the_table_lists_releases_images_and_exclusions() -> None:
    feed = feed_from_tsv()
    feed["4790.0.1"] = feed_entry("alpha", "2026-08-20", None)
    versions = _versions("580.178.04", channels=("stable", "alpha"), arches=("amd64",))
    table = matrix.to_table(matrix.build_matrix(_text(feed), versions)).splitlines()
    assert table[:3] == [
        "Flatcar releases (1):",
        "FLATCAR   STREAMS  KERNEL            ARCHES",
        "4593.2.5  stable   6.12.102-flatcar  amd64,arm64",
    ]
    assert table[5:8] == [
        "VARIANT      DRIVER      FLATCAR   KERNEL            ARCH   TAGS",
        "build        580.178.04  -         -                 amd64  580.178.04-flatcar (+1 alias)",
        (
            "precompiled  580.178.04  4593.2.5  6.12.102-flatcar  amd64  "
            "580.178.04-flatcar4593.2.5, 580-6.12.102-flatcar-flatcar4593.2.5"
        ),
    ]
    assert table[9] == "Excluded (1):"
    assert table[11].startswith("*        *       4790.0.1  *     Flatcar 4790.0.1 (alpha) has no")


@pytest.mark.parametrize(
    ("feed", "message"),
    [
        ("{not json", "the Flatcar releases feed is not JSON"),
        ("[1, 2]", "not an object keyed by version"),
        (json.dumps({"4593.2.5": {"channel": "stable", "major_software": {"kernel": ["6.1"]}}}),
         "releases feed: release 4593.2.5: architectures is not a list"),
    ],
)  # fmt: skip
def test_a_malformed_feed_is_one_clear_error(feed: str, message: str) -> None:
    with pytest.raises(ReleaseError, match=message) as error:
        matrix.build_matrix(feed, _versions())
    assert "\n" not in str(error.value)
