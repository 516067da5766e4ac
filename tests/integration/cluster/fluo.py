"""FLUO's real update-operator and update-agent (flatcar-linux-update-operator v0.10.0-rc2),
run as processes here with the ServiceAccounts and RBAC of FLUO's own ``examples/deploy``.

* ``update-operator`` (``cmd/update-operator/main.go``): ``--kubeconfig`` (a token kubeconfig
  for its ServiceAccount), ``--before-reboot-annotations`` (the gate's approval, as
  deploy/reboot-gate documents), ``POD_NAMESPACE`` for its leader-election lock
  (``pkg/operator/operator.go``: a ConfigMap and a Lease, ``flatcar-linux-update-operator-lock``).
  It reconciles every 30 s (``defaultReconciliationPeriod``), which no flag changes.
* ``update-agent`` (``cmd/update-agent/main.go``): ``--node``; its client is the in-cluster one
  (``k8sutil.GetClient("")``), update_engine and logind are on the D-Bus system bus
  (``pkg/dbus/conn.go`` ``godbus.SystemBusPrivate``, go-systemd ``login1.New``), and it reads
  ``/etc/os-release`` and ``/usr/share/flatcar/update.conf`` (``pkg/agent/agent.go``). So it runs
  chrooted into a tmpfs root of its own (a private mount namespace) that holds what its
  DaemonSet mounts (``examples/deploy/update-agent.yaml``: /var/run/dbus, /etc/flatcar,
  /usr/share/flatcar, /etc/os-release) plus the pod's ServiceAccount directory; /var/run/dbus
  there is the private bus (system_bus.py), and nothing of the host's /run is inside. It
  never reaches the host's logind: it has no way to.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

from apiserver import Cluster
from fixtures.docker_env import stop_process
from pods import SERVICE_ACCOUNT_DIR, in_cluster_env, service_account_dir, start
from system_bus import SOCKET, SystemBus

NAMESPACE = "reboot-coordinator"  # examples/deploy/00-namespace.yaml
OPERATOR_ACCOUNT = "flatcar-linux-update-operator-sa"  # update-operator-sa.yaml
AGENT_ACCOUNT = "flatcar-linux-update-agent"  # update-agent-sa.yaml
DEPLOY = ("00-namespace.yaml", "update-operator-sa.yaml", "update-agent-sa.yaml",
          "rbac/cluster-role.yaml", "rbac/cluster-role-binding.yaml", "rbac/role.yaml",
          "rbac/role-binding.yaml")  # fmt: skip
BUS_ADDRESS = f"unix:path=/var/run/dbus/{SOCKET}"  # godbus's default, made explicit


def install(cluster: Cluster, module: Path) -> None:
    """FLUO's namespace, ServiceAccounts and RBAC from its module's examples/deploy."""
    cluster.apply_files([module / "examples" / "deploy" / name for name in DEPLOY])


def fluo_logs(cluster: Cluster) -> tuple[Path, Path]:
    """Where running_operator and running_agent log: the update-operator's, the update-agent's."""
    return cluster.logs / "update-operator.log", cluster.logs / "update-agent.log"


@contextlib.contextmanager
def running_operator(cluster: Cluster, binaries: Path, workdir: Path,
                     before_reboot: list[str]) -> Iterator[subprocess.Popen[bytes]]:  # fmt: skip
    token = cluster.token(NAMESPACE, OPERATOR_ACCOUNT)
    kubeconfig = cluster.kubeconfig(workdir / "update-operator.kubeconfig", token=token)
    argv = [str(binaries / "update-operator"), f"--kubeconfig={kubeconfig}",
            f"--before-reboot-annotations={','.join(before_reboot)}", "-v=4"]  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "POD_NAMESPACE": NAMESPACE}
    process = start(argv, fluo_logs(cluster)[0], env)
    try:
        yield process
    finally:
        stop_process(process)


def flatcar_files(root: Path, version: str, group: str = "stable") -> None:
    """What the agent reads of the node: Flatcar's /etc/os-release and update.conf."""
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "os-release").write_text(
        f'NAME="Flatcar Container Linux by Kinvolk"\nID=flatcar\nID_LIKE=coreos\n'
        f"VERSION={version}\nVERSION_ID={version}\n"
    )
    (root / "usr" / "share" / "flatcar").mkdir(parents=True, exist_ok=True)
    (root / "usr" / "share" / "flatcar" / "update.conf").write_text(
        f"SERVER=https://public.update.flatcar-linux.net/v1/update/\nGROUP={group}\n"
    )


@contextlib.contextmanager
def running_agent(cluster: Cluster, binaries: Path, workdir: Path, node: str, *, bus: SystemBus,
                  version: str) -> Iterator[subprocess.Popen[bytes]]:  # fmt: skip
    """update-agent for node, chrooted as the module's docstring says."""
    host = workdir / "agent-host"
    flatcar_files(host, version)
    secrets = service_account_dir(cluster, workdir / "agent-serviceaccount", NAMESPACE,
                                  AGENT_ACCOUNT)  # fmt: skip
    root = workdir / "agent-root"
    root.mkdir(exist_ok=True)
    script = "\n".join([
        "set -e",
        'root="$1"; host="$2"; secrets="$3"; bus="$4"; bin="$5"; shift 5',
        'mount -t tmpfs gdc-agent-root "$root"',
        ('mkdir -p "$root/etc" "$root/usr/share/flatcar" "$root/var/run/dbus" "$root/tmp" '
         f'"$root{SERVICE_ACCOUNT_DIR}" "$root/bin"'),
        ': > "$root/etc/os-release"',
        'mount --bind "$host/etc/os-release" "$root/etc/os-release"',
        'mount --bind "$host/usr/share/flatcar" "$root/usr/share/flatcar"',
        f'mount --bind "$secrets" "$root{SERVICE_ACCOUNT_DIR}"',
        'mount --bind "$bus" "$root/var/run/dbus"',
        ': > "$root/bin/update-agent"',
        'mount --bind "$bin" "$root/bin/update-agent"',
        'exec chroot "$root" /bin/update-agent "$@"',
    ])  # fmt: skip
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(root),
            str(host), str(secrets), str(bus.directory), str(binaries / "update-agent"),
            f"--node={node}", "-v=4"]  # fmt: skip
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DBUS_SYSTEM_BUS_ADDRESS": BUS_ADDRESS,
           "HOME": "/", **in_cluster_env(cluster)}  # fmt: skip
    _refuse_unless_private(argv, env, bus)
    process = start(argv, fluo_logs(cluster)[1], env)
    try:
        yield process
    finally:
        stop_process(process)


def _refuse_unless_private(argv: list[str], env: dict[str, str], bus: SystemBus) -> None:
    """The agent calls logind's Reboot: check, before it starts, that the only bus it can
    reach is the private one (its address inside the chroot is the bind of bus.directory)."""
    if env.get("DBUS_SYSTEM_BUS_ADDRESS") != BUS_ADDRESS or str(bus.directory) not in argv:
        raise RuntimeError(f"update-agent would not be on the private bus: {env}, {argv}")
    if argv[:2] != ["unshare", "-m"] or "chroot" not in argv[6]:
        raise RuntimeError("update-agent must run chrooted in a mount namespace of its own")
    if not bus.socket.is_socket():
        raise RuntimeError(f"no private bus at {bus.socket}")
