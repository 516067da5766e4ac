"""Whether a runtime build can serve a staged release: the other way round from a tag check.

A node that runs the build image (or, under a ClusterPolicy, another release's precompiled
image whose packages do not match its kernel) compiles the modules when it starts. That works
for the staged kernel when:

* the driver's sources build on it: no kernel change the branch does not handle without a patch
  the image lacks (:func:`nvidia_driver.kbuild.compat.build_problem`);
* the release's kernel trees can build at all on the node's arch (arm64 before 4230.1.0 cannot);
* the image has a gcc of the kernel's major version. The major comes from the release's own
  kernel banner, read from its ``flatcar_production_image.vmlinuz`` as the precompiled image
  build reads it (verified against DIGESTS and Flatcar's signature: kbuild/release.py). The
  gcc majors are this image's own (``gcc-<major>`` on PATH): the gate runs from the build
  image, so it knows them only for that image. A major the image lacks does not hold the
  reboot: the build then uses the release's developer container, a slower start, which the
  verdict mentions.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvidia_driver.commands import Commands
from nvidia_driver.errors import DriverError
from nvidia_driver.kbuild.cachedirs import clear_work
from nvidia_driver.kbuild.compat import build_problem
from nvidia_driver.kbuild.compiler import Toolchain, gcc_major_of
from nvidia_driver.kbuild.release import FlatcarReleases, refuse_foreign_host_tools
from nvidia_driver.log import say


@dataclass(frozen=True)
class Outcome:
    problem: str = ""  # why the build cannot serve the release: the reboot is held
    note: str = ""  # what is worth saying when it can


@dataclass
class BuildImage:
    """The image the gate runs in: its driver (DRIVER_VERSION) and its compilers."""

    driver_version: str
    commands: Commands
    releases: FlatcarReleases  # the staged release's kernel banner, from its vmlinuz

    def sources_build(self, driver: str, version: str, arch: str, kernel: str) -> Outcome:
        """Whether driver's sources (a version or a branch) build on the release's kernel."""
        try:
            refuse_foreign_host_tools(version, arch)
        except DriverError as exc:
            return Outcome(problem=str(exc))
        return Outcome(problem=build_problem(driver, kernel))

    def compilers(self, version: str, arch: str) -> Outcome:
        """Whether this image has the gcc that built the release's kernel."""
        banner = self.releases.banner(version, arch)
        clear_work(self.releases.work)  # the vmlinuz: its banner is cached, the 32 MB are not
        major = gcc_major_of(banner)
        if major is None:
            return Outcome(problem=f"the kernel banner of Flatcar {version} names no gcc")
        if Toolchain().has(f"gcc-{major}", self.commands):
            return Outcome(note=f"builds with this image's gcc-{major}")
        say(f"Flatcar {version}'s kernel was built by gcc {major}, which this image lacks")
        return Outcome(
            note=f"no gcc-{major} in this image: the build uses the release's developer "
            "container (a download of about 480 MB at the first start)"
        )
