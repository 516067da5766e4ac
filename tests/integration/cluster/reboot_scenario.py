"""A reboot manager's scenario: Flatcar GPU nodes, each in an NVIDIADriver pool of its own, the
gate's manifests and the manager's own (FLUO's examples/deploy, kured's), on the session's API
server.

The nodes run stable 4459.2.0 and stage alpha 4515.0.0, both on kernel 6.12.54 (Flatcar's
releases feed); the driver is 595.91.07, whose images a scenario pushes to the suite's registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import fluo
import kured
import peers
from apiserver import Cluster
from fixtures.docker_env import Registry
from gate import install
from gpu_operator import flatcar_node, install_operator, nvidia_driver, register_node

DRIVER = "595.91.07"
RUNNING, STAGED, KERNEL = "4459.2.0", "4515.0.0", "6.12.54-flatcar"
MANAGERS: dict[str, Callable[[Cluster, Path], None]] = {
    "fluo": fluo.install,
    "kured": kured.install,
}


@dataclass
class RebootScenario:
    cluster: Cluster
    operator_module: Path
    binaries: dict[str, Path]  # each peer's, by name
    registry: Registry
    releases_feed: str

    @property
    def repository(self) -> str:
        return f"{self.registry.address}/gdc"

    def install(self, manager: str) -> None:
        """The Operator's namespace and CRDs, the gate's variant, the manager's own manifests."""
        install_operator(self.cluster, self.operator_module)
        install(self.cluster, manager)
        MANAGERS[manager](self.cluster, peers.module_dir(peers.load()[manager]))

    def gpu_node(self, name: str, pool: str) -> None:
        """A Flatcar GPU node on RUNNING, and an NVIDIADriver pool installing DRIVER on it."""
        self.cluster.apply(nvidia_driver(self.operator_module, pool, self.repository, DRIVER,
                                         name))  # fmt: skip
        register_node(self.cluster, flatcar_node(name, RUNNING, KERNEL))
