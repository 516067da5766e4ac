"""invoke matrix: which releases, drivers and arches get images, and what is left out and why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from flatcar_feed import feed_entry, feed_from_tsv, lts_info_text, with_markers

from gdc import matrix
from gdc.coverage import LtsInfo, covered_releases, parse_lts_info
from gdc.tags import Variant
from gdc.versions import Versions, VersionsError, load_versions, parse_versions

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


LTS = LtsInfo(parse_lts_info(lts_info_text()))


def _covered(feed: dict[str, Any], versions: Versions) -> dict[str, tuple[str, ...]]:
    covered, _, _ = covered_releases(_text(feed), versions, LTS)
    return {c.version: c.streams for c in covered}


def _build(feed: dict[str, Any] | str, versions: Versions, **options: Any) -> matrix.Matrix:
    text = feed if isinstance(feed, str) else _text(feed)
    return matrix.build_matrix(text, versions, lts_info=LTS, **options)


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


def test_dead_lts_streams_come_from_lts_info() -> None:
    feed = feed_from_tsv()
    feed["3510.3.8"] = feed_entry("lts", "2025-08-19", "5.15.189")
    feed["current-2023"] = feed["3510.3.8"]  # releases.json keeps dead markers forever
    covered, excluded, notes = covered_releases(_text(feed), _versions(), LTS)
    assert "3510.3.8" not in {c.version for c in covered}
    [exclusion] = excluded
    assert (exclusion.flatcar, exclusion.reason) == (
        "lts-2023",
        "lts-2023 (Flatcar 3510) is no longer supported (lts-info)",
    )
    assert notes == ()
    pinned = _covered(feed, _versions(pinned=("3510.3.8",)))
    assert pinned["3510.3.8"] == ("pinned",)


def test_without_lts_info_a_stream_is_judged_by_age_and_says_so() -> None:
    feed = feed_from_tsv()
    feed["3510.3.8"] = feed_entry("lts", "2025-06-30", "5.15.185")
    feed["current-2023"] = feed["3510.3.8"]
    unread = LtsInfo(unavailable="https://lts.example/lts-info: HTTP 503")
    covered, excluded, notes = covered_releases(_text(feed), _versions(), unread)
    assert {c.version: c.streams for c in covered}["4081.3.10"] == ("lts-2024",)
    [exclusion] = excluded
    assert exclusion.reason.startswith("lts-2023's newest release is from 2025-06-30, 409 days")
    assert "(lts-info unavailable)" in exclusion.reason
    assert notes[0].startswith("lts-info could not be read (https://lts.example/lts-info: HTTP")


def test_a_current_release_without_a_kernel_is_excluded_not_replaced() -> None:
    feed = feed_from_tsv()
    feed["4790.0.1"] = feed_entry("alpha", "2026-08-20", None)
    feed["4593.2.6"] = feed_entry("stable", "2026-08-20", None)
    feed = with_markers(feed)  # current now copies 4593.2.6, kernel and all
    covered, excluded, _ = covered_releases(_text(feed), _versions(), LTS)
    assert {c.version for c in covered} == {"4081.3.10", "4757.1.0"}
    assert sorted((x.flatcar, x.driver, x.arch) for x in excluded) == [
        ("4593.2.6", "*", "*"),
        ("4790.0.1", "*", "*"),
    ]
    assert next(x for x in excluded if x.flatcar == "4790.0.1").reason == (
        "Flatcar 4790.0.1 (alpha) has no kernel in the releases feed (major_software.kernel): "
        "its nodes get no image until the feed is fixed (report it to Flatcar); the first run "
        "after that publishes it"
    )


def test_an_old_release_without_a_kernel_does_not_matter() -> None:
    feed = feed_from_tsv()
    feed["4593.0.0"] = feed_entry("alpha", "2026-01-27", None)
    covered, excluded, notes = covered_releases(_text(feed), _versions(), LTS)
    assert len(covered) == 4
    assert excluded == ()
    assert notes == (
        (
            "1 older feed entry cannot be read, ignored: 4593.0.0 has no kernel in the "
            "releases feed (major_software.kernel)"
        ),
    )


def test_a_pinned_release_missing_from_the_feed_or_its_kernel_is_excluded() -> None:
    feed = feed_from_tsv()
    feed["4628.1.3"] = feed_entry("beta", "2026-06-01", None)
    _, excluded, _ = covered_releases(_text(feed), _versions(pinned=("4628.1.3", "1.2.3")), LTS)
    assert [x.flatcar for x in excluded] == ["4628.1.3", "1.2.3"]
    assert "(pinned) has no kernel" in excluded[0].reason
    assert excluded[1].reason == (
        "Flatcar 1.2.3 is pinned in versions.toml but not in the releases feed: check the version"
    )


def test_images_cross_drivers_kernels_and_arches() -> None:
    versions = _versions("580.178.04", "610.57.04", channels=("stable", "lts"))
    built = _build(feed_from_tsv(), versions, registry="ghcr.io/me")
    assert [(i.id, i.arches) for i in built.images] == [
        ("build-580.178.04", ("amd64", "arm64")),
        ("build-610.57.04", ("amd64", "arm64")),
        ("precompiled-580.178.04-6.6.150-flatcar", ("amd64",)),
        ("precompiled-580.178.04-6.12.102-flatcar", ("amd64", "arm64")),
        ("precompiled-610.57.04-6.6.150-flatcar", ("amd64",)),
        ("precompiled-610.57.04-6.12.102-flatcar", ("amd64", "arm64")),
    ]
    build, precompiled = built.images[1], built.images[5]
    assert build.tags.references == (
        "ghcr.io/me/driver:610.57.04-flatcar",
        "ghcr.io/me/driver:610.57.04-flatcar-flatcar4081.3.10",
        "ghcr.io/me/driver:610.57.04-flatcar-flatcar4593.2.5",
    )
    assert precompiled.variant is Variant.PRECOMPILED
    assert precompiled.tags.tags == (
        "610.57.04-flatcar4593.2.5",
        "610-6.12.102-flatcar-flatcar4081.3.9",
        "610-6.12.102-flatcar-flatcar4081.3.10",
        "610-6.12.102-flatcar-flatcar4593.2.4",
        "610-6.12.102-flatcar-flatcar4593.2.5",
    )


def test_arm64_releases_with_x86_host_tools_in_their_tree_are_excluded_with_the_reason() -> None:
    built = _build(feed_from_tsv(), _versions(channels=("lts",)))
    [lts] = [i for i in built.images if i.variant is Variant.PRECOMPILED]
    assert lts.arches == ("amd64",)
    [exclusion] = built.excluded
    assert (exclusion.flatcar, exclusion.arch) == ("4081.3.10", "arm64")
    assert exclusion.reason.startswith("Flatcar 4081.3.10's arm64 module build tree carries "
                                       "x86-64 host tools")  # fmt: skip
    assert matrix.arch_problem(built.releases[0], "amd64") == ""
    for version, channel, problem in (("4230.1.0", "beta", False), ("4230.0.1", "alpha", True),
                                      ("4277.0.0", "alpha", False), ("4230.2.0", "stable", False),
                                      ("4186.1.1", "beta", True)):  # fmt: skip
        feed = with_markers({version: feed_entry(channel, "2026-01-01", "6.6.1")})
        covered = _build(feed, _versions(channels=(channel,)))
        assert bool(matrix.arch_problem(covered.releases[0], "arm64")) is problem, version


def test_one_precompiled_image_carries_every_live_release_of_its_kernel() -> None:
    built = _build(feed_from_tsv(), _versions())
    [kernel_image] = [i for i in built.images if i.kernel == "6.12.102-flatcar"]
    assert [c.version for c in kernel_image.platform("arm64").releases] == [
        "4593.2.5", "4757.1.0", "4790.0.0"]  # fmt: skip
    assert kernel_image.tags.tags[:3] == (
        "610.57.04-flatcar4593.2.5",
        "610.57.04-flatcar4757.1.0",
        "610.57.04-flatcar4790.0.0",
    )
    assert "610-6.12.102-flatcar-flatcar4081.3.10" in kernel_image.tags.tags


def test_a_branch_a_kernel_broke_is_excluded_unless_a_patch_fixes_it() -> None:
    """535 and 570 ship the pci_resize_resource patch, 560 has none, 580 needs none."""
    versions = _versions("535.261.03", "560.35.03", "570.195.03", "580.178.04")
    built = _build(feed_from_tsv(), versions)
    broken = [(x.driver, x.flatcar) for x in built.excluded if x.variant == "*"]
    assert broken == [("560.35.03", "4593.2.5"), ("560.35.03", "4757.1.0"),
                      ("560.35.03", "4790.0.0")]  # fmt: skip
    reason = next(x.reason for x in built.excluded if x.driver == "560.35.03")
    assert reason.startswith(
        "driver 560.35.03 kernel-open does not build on kernel 6.12.102-flatcar: it needs patch "
        "pci-resize-resource-exclude-bars (kernels from 6.12.97; fixed by NVIDIA from branch 580)"
    )
    assert "patches/index.json has none for branch 560" in reason
    build_560 = next(i for i in built.images if i.id == "build-560.35.03")
    assert build_560.aliases == ("4081.3.10",)  # LTS 4081 runs 6.6: unaffected
    assert {c.version for i in built.images if i.driver.version == "570.195.03"
            for c in i.releases} == {"4081.3.10", "4593.2.5", "4757.1.0", "4790.0.0"}  # fmt: skip


def test_a_release_not_built_for_an_arch_gets_no_platform_for_it() -> None:
    feed = feed_from_tsv()
    feed["4790.0.0"]["architectures"] = ["amd64"]
    built = _build(with_markers(feed), _versions(channels=("alpha",)))
    assert [(i.id, i.arches) for i in built.images] == [
        ("build-610.57.04", ("amd64", "arm64")),
        ("precompiled-610.57.04-6.12.102-flatcar", ("amd64",)),
    ]
    [exclusion] = built.excluded
    assert (exclusion.variant, exclusion.arch) == ("precompiled", "arm64")
    assert exclusion.reason == "Flatcar 4790.0.0 is not released for arm64"


def test_a_duplicate_branch_is_refused() -> None:
    with pytest.raises(VersionsError, match=r"drivers 580\.105\.08 and 580\.178\.04 are both "
                       "branch 580: keep one driver per branch"):  # fmt: skip
        _versions("580.105.08", "580.178.04")


def test_the_json_is_one_line_with_the_same_keys_in_every_entry() -> None:
    versions = _versions(channels=("stable",), arches=("amd64",))
    text = matrix.to_json(_build(feed_from_tsv(), versions, prefix="t"))
    assert "\n" not in text
    document = json.loads(text)
    assert set(document) == {"include", "excluded", "releases", "drivers", "arches", "group",
                             "notes"}  # fmt: skip
    assert document["drivers"] == ["610.57.04"]
    assert document["arches"] == [{"arch": "amd64", "runner": "ubuntu-24.04",
                                   "group": "publish driver:t amd64"}]  # fmt: skip
    assert document["group"] == "publish driver:t"
    build, precompiled = document["include"]
    assert build == {
        "id": "build-610.57.04-amd64", "variant": "build", "driver": "610.57.04",
        "branch": "610", "arch": "amd64", "flatcar": [], "streams": [],
        "kernel": "", "aliases": ["4593.2.5"], "repository": "driver",
        "tags": ["t-610.57.04-flatcar", "t-610.57.04-flatcar-flatcar4593.2.5"],
    }  # fmt: skip
    assert precompiled == {
        "id": "precompiled-610.57.04-6.12.102-flatcar-amd64", "variant": "precompiled",
        "driver": "610.57.04", "branch": "610", "arch": "amd64", "flatcar": ["4593.2.5"],
        "streams": ["stable"], "kernel": "6.12.102-flatcar",
        "aliases": [], "repository": "driver",
        "tags": ["t-610.57.04-flatcar4593.2.5", "t-610-6.12.102-flatcar-flatcar4593.2.4",
                 "t-610-6.12.102-flatcar-flatcar4593.2.5"],
    }  # fmt: skip
    assert document["releases"] == [
        {"flatcar": "4593.2.5", "channel": "stable", "streams": ["stable"],
         "kernel": "6.12.102-flatcar"}
    ]  # fmt: skip
    assert document["excluded"] == []


def test_the_table_lists_releases_images_exclusions_and_notes() -> None:
    feed = feed_from_tsv()
    feed["4790.0.1"] = feed_entry("alpha", "2026-08-20", None)
    feed["bogus"] = {"channel": "stable"}
    versions = _versions("580.178.04", channels=("stable", "alpha"), arches=("amd64",))
    table = matrix.to_table(_build(feed, versions)).splitlines()
    assert table[:3] == [
        "Flatcar releases (1):",
        "FLATCAR   STREAMS  KERNEL            ARCHES",
        "4593.2.5  stable   6.12.102-flatcar  amd64,arm64",
    ]
    assert table[5].split() == ["VARIANT", "DRIVER", "FLATCAR", "KERNEL", "ARCHES", "TAGS"]
    assert table[6].split() == ["build", "580.178.04", "-", "-", "amd64", "580.178.04-flatcar",
                                "(+1", "tag)"]  # fmt: skip
    assert table[9] == "Excluded (1):"
    assert table[11].startswith("*        *       4790.0.1  *     Flatcar 4790.0.1 (alpha) has no")
    assert table[13] == "Notes (1):"
    assert table[14].startswith("- the releases feed has 1 key(s) that are neither a version")


# --- invoke matrix on a malformed feed: one line, exit 1, no traceback -------------------------

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("kernel", ["", "junk", "6.", ["6.12.102"], "6.12.102; rm -rf /"])
def test_invoke_matrix_on_a_malformed_kernel_is_one_line_naming_the_release_and_field(
    tmp_path: Path, kernel: object
) -> None:
    """The current stable release is the only one wanted, and its kernel does not parse."""
    feed = feed_from_tsv()
    feed["4593.2.5"]["major_software"]["kernel"] = [kernel]
    feed = with_markers(feed)
    (tmp_path / "releases.json").write_text(json.dumps(feed))
    (tmp_path / "versions.toml").write_text(
        '[images]\nchannels = ["stable"]\narches = ["amd64"]\n'
        f'[drivers."610.57.04"]\nsha256 = {{ amd64 = "{SUM}" }}\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(ROOT), "matrix",
         "--versions-file", str(tmp_path / "versions.toml"),
         "--releases-url", (tmp_path / "releases.json").as_uri()],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("invoke matrix: the releases feed covers none of the channels")
    assert "Flatcar 4593.2.5 (stable) has a kernel" in line
    assert "(major_software.kernel) that is not a kernel release" in line


def test_a_malformed_kernel_of_one_stream_excludes_that_stream_and_no_other() -> None:
    feed = feed_from_tsv()
    feed["4790.0.0"]["major_software"]["kernel"] = ["junk"]
    built = _build(feed, _versions())
    assert {c.version for c in built.releases} == {"4081.3.10", "4593.2.5", "4757.1.0"}
    [exclusion] = [x for x in built.excluded if x.flatcar == "4790.0.0"]
    assert exclusion.reason.startswith("Flatcar 4790.0.0 (alpha) has a kernel 'junk' in the "
                                       "releases feed (major_software.kernel)")  # fmt: skip


def test_a_new_kernel_s_image_is_tagged_for_the_release_each_stream_superseded() -> None:
    # Stable 4593.2.5 brings kernel 6.12.102; nodes still on 4593.2.4 (6.12.95) may be the
    # first GPU node the Operator lists, so an updated node asks for 6.12.102 with 4593.2.4's
    # OS tag.
    versions = _versions(channels=("stable", "lts"), arches=("amd64",))
    built = _build(feed_from_tsv(), versions)
    [image] = [i for i in built.images if i.kernel == "6.12.102-flatcar"]
    assert "610-6.12.102-flatcar-flatcar4593.2.4" in image.tags.tags
    assert "610-6.12.102-flatcar-flatcar4081.3.9" in image.tags.tags
    assert [c.version for c in image.releases] == ["4593.2.5"]  # what it carries is unchanged
    assert "610.57.04-flatcar4593.2.4" not in image.tags.tags
