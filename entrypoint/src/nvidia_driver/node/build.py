"""``nvidia-driver build``: compile and package the kernel modules, without loading anything.

For a Flatcar release (``--flatcar-version``: as the precompiled images are built, on any
machine), or for the running node. It starts as ``init`` does (lifecycle.chosen_pipeline) and
ends with the package in the cache and, with ``--output``, a copy of it there.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from nvidia_driver.atomic import replacing
from nvidia_driver.config import DriverConfig
from nvidia_driver.kbuild.packages import Package
from nvidia_driver.kbuild.pipeline import Target
from nvidia_driver.log import say
from nvidia_driver.node.host import read_host_facts
from nvidia_driver.node.lifecycle import Context, chosen_pipeline, node_target
from nvidia_driver.node.peermem import rdma_plan


def build_command(
    ctx: Context,
    config: DriverConfig,
    *,
    module_type: str | None,
    flatcar_version: str | None,
    output: Path | None,
) -> Package:
    """Build one package: for that Flatcar release, else for the running node."""
    if module_type:  # auto too: it overrides KERNEL_MODULE_TYPE, as --help says
        config = replace(config, kernel_module_type=module_type)
    if flatcar_version:
        # Without GPUs to look at, "auto" follows the branch.
        package = chosen_pipeline(ctx, config, []).package(Target(flatcar_version))
    else:
        facts = read_host_facts(ctx.paths)
        target = node_target(facts, rdma_plan(ctx.paths, config, facts).ofa_tree)
        package = chosen_pipeline(ctx, config, facts.gpus).package(target)
    if output is not None:
        destination = output / package.metadata.module_type / package.path.name
        with replacing(destination) as staged:
            shutil.copytree(package.path, staged)
        package = replace(package, path=destination)
    say(f"Packaged NVIDIA driver package {package.name} into {package.path}")
    return package
