"""invoke's configuration for the tasks (section images) and their help texts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tasks
from invoke.config import Config
from invoke.context import MockContext
from invoke.exceptions import Exit
from invoke.runners import Result

from gdc import cli_tasks, task_options
from gdc.compression import DEFAULT_LEVEL
from gdc.tags import TagError
from gdc.task_options import CONFIG_SECTION, LEVEL_NOT_GIVEN, Configured

ROOT = Path(tasks.__file__).parent


def _context(**settings: object) -> MockContext:
    config = Config(overrides={CONFIG_SECTION: settings}) if settings else None
    git = {
        "git rev-parse HEAD": Result("0123abcd" * 5 + "\n"),
        "git remote get-url origin": Result("https://example.invalid/gdc.git\n"),
        "git log -1 --format=%cI": Result("2026-08-20T10:00:00+00:00\n"),
    }
    return MockContext(config=config, run=git)


def test_without_configuration_the_built_in_defaults() -> None:
    settings = Configured.of(None)
    assert settings == Configured()
    defaults = (settings.network, settings.compression, settings.zstd_level)
    assert defaults == ("host", "zstd", DEFAULT_LEVEL)
    assert settings.upstream.keyring is None


def test_an_option_wins_over_the_configuration() -> None:
    configured = Configured.of({"base_image": "mirror/debian", "zstd_level": 3})
    given = configured.given(base_image="", zstd_level=LEVEL_NOT_GIVEN, compression="gzip")
    assert (given.base_image, given.zstd_level, given.compression) == ("mirror/debian", 3, "gzip")
    assert configured.given(zstd_level=0).zstd_level == 0  # given, so check_level refuses it
    assert configured.given(base_image="other").upstream.base_image == "other"


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"base-image": "x"}, "no setting images.base-image: use base_image, "),
        ({"zstd_level": "19"}, r"images.zstd_level is '19': give a whole number"),
        ({"zstd_level": True}, "images.zstd_level is True"),
        ({"network": 1}, "images.network is 1: give a string"),
        ("host", "'images' is not a mapping"),
    ],
)
def test_a_wrong_setting_is_refused_by_name(section: object, message: str) -> None:
    with pytest.raises(TagError, match=message):
        Configured.of(section)


def test_the_configuration_reaches_a_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A mirror's settings from invoke's configuration, as the options would give them."""
    seen: list[tuple[str, bool]] = []

    def refuse(host: str, multi_arch: bool) -> None:
        seen.append((host, multi_arch))
        raise Exit("stop before dockerd")

    monkeypatch.setattr(cli_tasks, "connect_docker", refuse)
    c = _context(docker_host="tcp://127.0.0.1:2375",
                 releases_url=(tmp_path / "missing.json").as_uri())  # fmt: skip
    with pytest.raises(Exit, match=r"cannot read the Flatcar releases feed \(.*missing\.json"):
        tasks.build(c, variant="build", arch="amd64")
    with pytest.raises(Exit, match="stop before dockerd"):
        tasks.build(c, variant="build", arch="amd64", flatcar_version="4593.2.5",
                    releases_url=_feed(tmp_path), driver_sha256="ab" * 32)  # fmt: skip
    assert seen == [("tcp://127.0.0.1:2375", False)]


def _feed(tmp_path: Path) -> str:
    entry = {"channel": "stable", "architectures": ["amd64"],
             "release_date": "2026-08-13 09:26:25 +0000",
             "major_software": {"kernel": ["6.12.102"]}}  # fmt: skip
    path = tmp_path / "releases.json"
    path.write_text(f'{{"4593.2.5": {entry}, "current": {entry}}}'.replace("'", '"'))
    return path.as_uri()


def test_a_wrong_configuration_is_an_exit_naming_the_task() -> None:
    with pytest.raises(Exit, match=r"invoke tags: invoke's configuration has no setting images\.x"):
        tasks.tags(_context(x="1"))


def test_invoke_reads_the_settings_from_its_environment_variables() -> None:
    """INVOKE_IMAGES_<KEY>: invoke knows the keys from tasks.py's ns.configure."""
    env = {**os.environ, "INVOKE_IMAGES_ZSTD_LEVEL": "30"}
    result = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(ROOT), "build"],
                            capture_output=True, text=True, timeout=60, check=False,
                            env=env)  # fmt: skip
    assert result.returncode == 1
    assert "invoke build: --zstd-level 30 is out of range" in result.stderr


def test_every_configurable_option_names_its_key() -> None:
    for name in tasks.ns.task_names:
        for argument in tasks.ns[name].get_arguments():
            key = argument.name
            configurable = key in task_options.CONFIGURED and not (
                name == "propose-drivers" and key == "releases_url"  # NVIDIA's, not Flatcar's
            )
            assert (f"[invoke config: images.{key}]" in (argument.help or "")) == configurable, (
                name, key)  # fmt: skip
