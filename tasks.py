"""Image tasks (``invoke --list``). Each task is a thin wrapper over the ``gdc`` tooling."""

from __future__ import annotations

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task


@task(
    help={
        "variant": "build (compiles at runtime) or precompiled (one per Flatcar release)",
        "driver_version": "the NVIDIA driver version (default: newest in versions file)",
        "flatcar_version": "the Flatcar release (default: current stable)",
    }
)
def build(
    c: Context,
    variant: str = "precompiled",
    driver_version: str = "",
    flatcar_version: str = "",
) -> None:
    """Build a driver image."""
    del c, driver_version, flatcar_version
    raise Exit(
        f"image builds (variant {variant}) are not available yet: the Dockerfiles and the "
        "build tooling land with the images issue; see README.md",
        code=2,
    )


ns = Collection(build)
