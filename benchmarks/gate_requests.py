"""The registry requests that N nodes waiting for their reboot make in an hour, before and after.

kured reboots about one node an hour, so the nodes in its queue wait for hours with their gate
looking every minute. Each node is one gate process; the hour is simulated (the registry
client's clock is moved 60 s a look, nothing sleeps), the requests are real, to the unit
tests' OCI registry on 127.0.0.1 with token authentication (a 401 with a Bearer challenge, a
token endpoint; tokens with no ``expires_in``, so the spec's 60 s), as a private ghcr.io
repository answers. Side by side in one run:

* before: the gate's registry client as of commit BEFORE (read from git), made anew for every
  look, as verdict.py did there: a 401, a token and a manifest GET (and the config blob of a
  single-arch image) per look;
* after: this checkout's client, one per gate process.

Three cases: the staged release's image published as an index (the nodes are open, waiting
their turn), published single-arch (the LTS precompiled images: the arch is in the config
blob), and not published yet (the nodes are held). Manifest GETs count against Docker Hub's
pull limit; HEADs do not.

Usage: python benchmarks/gate_requests.py [NODES] [--record]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "entrypoint" / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from oci_registry import OCIRegistry
from record import REPOSITORY, Report, add_record_option

from nvidia_driver.formats.oci import Credentials
from nvidia_driver.gate import registry as after
from nvidia_driver.gate.gate import DEFAULT_INTERVAL
from nvidia_driver.sources.download import Backoff

BEFORE = "9885928"  # verdict.py made a registry client per look there (issue 37, fault 3)
HOUR = 3600.0
TAG = "610.57.04-flatcar4593.2.5"
CASES = ("index, published", "single-arch, published", "not published yet")


def module_at(commit: str) -> types.ModuleType:
    """The gate's registry module as it was at ``commit``, beside this checkout's."""
    path = "entrypoint/src/nvidia_driver/gate/registry.py"
    source = subprocess.run(["git", "-C", str(REPOSITORY), "show", f"{commit}:{path}"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    module = types.ModuleType(f"gate_registry_{commit}")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{commit}:{path}", "exec"), module.__dict__)  # noqa: S102 - our own code
    return module


@dataclass
class Clock:
    """The registry clients' time, which an_hour moves: nothing sleeps."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def publish(registry: OCIRegistry, case: str) -> None:
    registry.manifests.clear()
    if case != "not published yet":
        registry.add_image("o/driver", [TAG], ("amd64",), index=case.startswith("index"))


def an_hour(nodes: int, look: Callable[[int], Any], clock: Clock) -> None:
    """Every node looks once a minute, for an hour."""
    clock.now = 0.0
    while clock.now < HOUR:
        for node in range(nodes):
            look(node)
        clock.now += DEFAULT_INTERVAL


def kinds(log: list[tuple[str, str, str]]) -> Counter[str]:
    """The requests by kind. Every request to the repository without a token is answered 401
    (the registry wants one): those are counted as such, whatever they asked for."""
    counted: Counter[str] = Counter()
    for method, path, authorization in log:
        if path == "/token":
            counted["token"] += 1
        elif not authorization:
            counted["401 (no token yet)"] += 1
        elif "/blobs/" in path:
            counted["blob GET"] += 1
        else:
            counted[f"manifest {method}"] += 1
    return counted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nodes", nargs="?", type=int, default=24,
                        help="nodes waiting (default 24: a day of kured's queue)")  # fmt: skip
    add_record_option(parser)
    args = parser.parse_args()
    before = module_at(BEFORE)
    backoff = Backoff(attempts=1)
    with Report("gate_requests", record=args.record), OCIRegistry() as registry:
        registry.username, registry.password = "robot", "s3cret"
        secret = [(registry.host, Credentials("robot", "s3cret"))]
        image = after.ImageRef.parse(f"{registry.host}/o/driver:{TAG}")
        old_image = before.ImageRef.parse(str(image))
        old_secret = {registry.host: before.Credentials("robot", "s3cret")}
        print(f"{args.nodes} nodes waiting, one look a minute each, for an hour (simulated);")
        print(f"before: {BEFORE}'s client made per look; after: one client per gate process")
        for case in CASES:
            publish(registry, case)
            clock = Clock()

            def old_look(_: int) -> None:
                before.Registry(old_secret, backoff=backoff).presence(old_image, "amd64")

            clients = [after.Registry(backoff=backoff, clock=clock) for _ in range(args.nodes)]

            def new_look(node: int, clients: list[after.Registry] = clients) -> None:
                clients[node].presence(image, "amd64", secret)

            counts = []
            for look in (old_look, new_look):
                registry.log.clear()
                an_hour(args.nodes, look, clock)
                counts.append(kinds(registry.log))
            old, new = (sum(count.values()) for count in counts)
            print(f"\n{case}: requests per hour, {args.nodes} nodes")
            for kind in sorted(set(counts[0]) | set(counts[1])):
                print(f"  {kind:<22} before {counts[0][kind]:6d}   after {counts[1][kind]:6d}")
            print(f"  {'all':<22} before {old:6d}   after {new:6d}   ratio after/before "
                  f"{new / old:.3f}")  # fmt: skip
            gets = [c["manifest GET"] + c["blob GET"] for c in counts]
            print(f"  GETs (pull-limited)    before {gets[0]:6d}   after {gets[1]:6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
