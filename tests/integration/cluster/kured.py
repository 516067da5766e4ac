"""kured's real binary (kubereboot/kured 1.16.1), run as a process here with the ServiceAccount,
RBAC and DaemonSet of its own ``kured-rbac.yaml`` and ``kured-ds.yaml``.

What 1.16.1 does (``cmd/kured/main.go``): its client is the in-cluster one
(``rest.InClusterConfig``); its lock is an annotation on its own DaemonSet (``--ds-namespace``,
``--ds-name``: kube-system/kured); it checks ``--reboot-sentinel`` with ``test -f`` every
``--period`` (after a first wait of 30 to 90 s for its startup lock check, ``delaytick``:
no flag shortens it), asks each ``--blocking-pod-selector`` for pods on its node that have not
ended, drains, and runs ``--reboot-command`` (``--reboot-method=command``, the default) wrapped
as ``/usr/bin/nsenter -m/proc/1/ns/mnt -- <command>`` (``buildHostCommand``: PID 1's mount
namespace, the host's under ``hostPID: true``).

Never this machine's: kured runs in a PID and mount namespace of its own (``unshare -m -p
--fork --mount-proc --kill-child``), where PID 1 is kured itself, so the nsenter enters kured's
own private mount namespace; and its reboot command is a script that appends a line to a file.
:func:`running_kured` checks both before it starts it. ``--reboot-method=signal`` (SIGRTMIN+5 to
PID 1) is never used.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from apiserver import Cluster
from fixtures.docker_env import free_port, stop_process
from pods import SERVICE_ACCOUNT_DIR, in_cluster_env, service_account_dir, start

NAMESPACE, ACCOUNT, DAEMONSET = "kube-system", "kured", "kured"  # kured-rbac.yaml, kured-ds.yaml
LOCK = "weave.works/kured-node-lock"  # main.go KuredNodeLockAnnotation
RECORDER = '#!/bin/sh\necho "reboot asked: $0 $*" >> {reboots}\n'  # all kured's reboot does


def install(cluster: Cluster, module: Path) -> None:
    """kured's RBAC and DaemonSet from its module (the DaemonSet holds its lock; no controller
    runs it here)."""
    cluster.apply_files([module / "kured-rbac.yaml", module / "kured-ds.yaml"])


@dataclass(frozen=True)
class Kured:
    process: subprocess.Popen[bytes]
    sentinel: Path  # --reboot-sentinel: touch it to say a reboot is required
    reboots: Path  # one line per run of the reboot command

    def rebooted(self) -> list[str]:
        return self.reboots.read_text().splitlines() if self.reboots.exists() else []


@contextlib.contextmanager
def running_kured(cluster: Cluster, binaries: Path, workdir: Path, node: str, *,
                  blocking_pod_selector: str, period: str = "5s") -> Iterator[Kured]:  # fmt: skip
    secrets = service_account_dir(cluster, workdir / "kured-serviceaccount", NAMESPACE, ACCOUNT)
    sentinel = workdir / "reboot-required"  # update_engine's postinst touches /run/reboot-required
    reboots = workdir / "kured-reboots"
    recorder = workdir / "record-reboot"
    recorder.write_text(RECORDER.format(reboots=reboots))
    recorder.chmod(0o755)
    # A tmpfs over /run (/var/run's target) in kured's mount namespace: its ServiceAccount
    # directory is made there, not on the host.
    script = (
        "set -e; mount -t tmpfs gdc-kured-run /run; "
        f'mkdir -p {SERVICE_ACCOUNT_DIR}; mount --bind "$1" {SERVICE_ACCOUNT_DIR}; shift; '
        'exec "$@"'
    )
    argv = [
        "unshare", "-m", "-p", "--fork", "--mount-proc", "--kill-child", "--propagation",
        "private", "sh", "-c", script, "sh", str(secrets),
        str(binaries / "kured"), f"--node-id={node}", f"--period={period}",
        f"--ds-namespace={NAMESPACE}", f"--ds-name={DAEMONSET}",
        f"--reboot-sentinel={sentinel}", f"--blocking-pod-selector={blocking_pod_selector}",
        "--reboot-method=command", f"--reboot-command={recorder}",
        "--metrics-host=127.0.0.1", f"--metrics-port={free_port()}",
    ]  # fmt: skip
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **in_cluster_env(cluster)}
    _refuse_unless_harmless(argv, recorder)
    process = start(argv, cluster.logs / "kured.log", env)
    try:
        yield Kured(process, sentinel, reboots)
    finally:
        stop_process(process)


def _refuse_unless_harmless(argv: list[str], recorder: Path) -> None:
    """kured must not reach this machine's PID 1 nor run a real reboot command."""
    if argv[:6] != ["unshare", "-m", "-p", "--fork", "--mount-proc", "--kill-child"]:
        raise RuntimeError(f"kured must run in a PID namespace of its own: {argv}")
    commands = [arg for arg in argv if arg.startswith(("--reboot-command=", "--reboot-method="))]
    if commands != ["--reboot-method=command", f"--reboot-command={recorder}"]:
        raise RuntimeError(f"kured's reboot must be the recorder: {commands}")
    if recorder.read_text() != RECORDER.format(reboots=recorder.parent / "kured-reboots"):
        raise RuntimeError(f"{recorder} must only record")
