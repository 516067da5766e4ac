"""Every environment variable the image honours: its name, default, who sets it, what reads it.

The code reads each by the name defined here; ``nvidia-driver settings`` and docs/settings.md
are made from this table, and tests/unit/test_settings.py fails when the code reads a variable
the table lacks (or the table keeps one nothing reads).
"""

from __future__ import annotations

import textwrap
from typing import NamedTuple


class Setting(NamedTuple):
    name: str  # a prefix ends in "_": NVFM_CONFIG_<FIELD>
    default: str | None  # as text; None: no default (required, or unset means off)
    set_by: str
    commands: tuple[str, ...]  # the nvidia-driver commands that read it; () for another reader
    meaning: str
    reader: str = ""  # what reads it when no nvidia-driver command does


SETTINGS: dict[str, Setting] = {}

# Who sets a variable.
OPERATOR = "GPU Operator"
IMAGE = "image build"
GATE = "deploy/reboot-gate"
USER = "user"
# The driver commands, which read DriverConfig (cli.dispatch), and those that make a build
# pipeline (kbuild/pipeline.py: the cache, Flatcar's releases, downloads).
DRIVER_COMMANDS = (
    "init",
    "build",
    "load",
    "unload",
    "status",
    "reload_nvidia_peermem",
    "probe_nvidia_peermem",
)
PIPELINE = ("init", "build", "load", "status")
GATE_COMMAND = ("reboot-gate",)
# python -m nvidia_driver.image.provision: the image build's download of NVIDIA's archives.
PROVISION = ("provision",)


def _setting(  # noqa: PLR0917 - one argument a column
    name: str,
    default: str | None,
    set_by: str,
    commands: tuple[str, ...],
    meaning: str,
    reader: str = "",
) -> str:
    SETTINGS[name] = Setting(name, default, set_by, commands, meaning, reader)
    return name


# The driver, as the image carries it.
DRIVER_VERSION = _setting(
    "DRIVER_VERSION", None, f"{IMAGE} (versions.toml)", (*DRIVER_COMMANDS, *GATE_COMMAND),
    "the driver version the image carries, e.g. 580.105.08 (required but by "
    "probe_nvidia_peermem; status without it shows the host only, and fails); the gate looks "
    "for the image of this version",
)  # fmt: skip
DRIVER_BRANCH = _setting(
    "DRIVER_BRANCH", "DRIVER_VERSION's major", IMAGE, DRIVER_COMMANDS,
    "the driver's branch; must match DRIVER_VERSION",
)  # fmt: skip
TARGETARCH = _setting(
    "TARGETARCH",
    "the machine's",
    IMAGE,
    DRIVER_COMMANDS,
    "amd64 or arm64: the driver's architecture",
)
# The Operator's driver DaemonSet (docs/gpu-operator.md).
KERNEL_MODULE_TYPE = _setting(
    "KERNEL_MODULE_TYPE", "auto", f"{OPERATOR} (driver.kernelModuleType)", DRIVER_COMMANDS,
    "auto, open or proprietary: which kernel modules to load",
)  # fmt: skip
OPEN_KERNEL_MODULES_ENABLED = _setting(
    "OPEN_KERNEL_MODULES_ENABLED", "false", f"{OPERATOR} (with kernelModuleType open)",
    DRIVER_COMMANDS,
    "true: open modules, read only when KERNEL_MODULE_TYPE is empty (the Operator's older name)",
)  # fmt: skip
DRIVER_CONFIG_DIGEST = _setting(
    "DRIVER_CONFIG_DIGEST", None, f"{OPERATOR} (v26 on)", DRIVER_COMMANDS,
    "the Operator's digest of the driver's configuration, kept in "
    "/run/nvidia/nvidia-driver.state: an unchanged digest keeps the loaded driver",
)  # fmt: skip
GPU_DIRECT_RDMA_ENABLED = _setting(
    "GPU_DIRECT_RDMA_ENABLED", "false", f"{OPERATOR} (driver.rdma.enabled)", DRIVER_COMMANDS,
    "true: load nvidia-peermem (the peermem sidecar)",
)  # fmt: skip
USE_HOST_MOFED = _setting(
    "USE_HOST_MOFED", "false", f"{OPERATOR} (driver.rdma.useHostMofed)", DRIVER_COMMANDS,
    "true: MOFED is the host's, so the sidecar waits for mlx5_core, not the MOFED container",
)  # fmt: skip
NODE_NAME = _setting(
    "NODE_NAME", None, f"{OPERATOR}, {GATE} (the pod's node)", GATE_COMMAND,
    "the node the pod runs on; the gate holds this node's reboot",
)  # fmt: skip
NVFM_CONFIG_ = _setting(
    "NVFM_CONFIG_", None, f"{USER} (driver.env)", DRIVER_COMMANDS,
    "NVFM_CONFIG_<FIELD>=value: sets FIELD in fabricmanager.cfg",
)  # fmt: skip
MAX_THREADS = _setting(
    "MAX_THREADS", "the CPUs", f"{USER} (driver.env, or init -m N in spec.args)", DRIVER_COMMANDS,
    "parallel compile jobs of a runtime build",
)  # fmt: skip
ALLOW_NON_FLATCAR = _setting(
    "ALLOW_NON_FLATCAR",
    "false",
    USER,
    DRIVER_COMMANDS,
    "true: run on a host that is not Flatcar (tests)",
)
# Where the image works.
NVIDIA_DRIVER_HOST_ROOT = _setting(
    "NVIDIA_DRIVER_HOST_ROOT", "/", USER, DRIVER_COMMANDS,
    "the host's paths (/proc, /sys, /run/nvidia) under this directory; --host-root wins (tests)",
)  # fmt: skip
NVIDIA_DRIVER_CACHE_DIR = _setting(
    "NVIDIA_DRIVER_CACHE_DIR", "/run/nvidia/cache (gate: /var/cache/nvidia-reboot-gate/cache)",
    USER, (*PIPELINE, *GATE_COMMAND), "the small, kept cache: packages, keys, logs",
)  # fmt: skip
NVIDIA_DRIVER_WORK_DIR = _setting(
    "NVIDIA_DRIVER_WORK_DIR", "/var/cache/nvidia-driver (gate: /var/cache/nvidia-reboot-gate/work)",
    USER, (*PIPELINE, *GATE_COMMAND), "the large, transient work directory: kernel trees, builds",
)  # fmt: skip
PATH = _setting(
    "PATH", "os.defpath", IMAGE, (*DRIVER_COMMANDS, *GATE_COMMAND), "where commands are found"
)
# Downloads (sources/download.py).
NVIDIA_DRIVER_DOWNLOAD_TIMEOUT = _setting(
    "NVIDIA_DRIVER_DOWNLOAD_TIMEOUT", "60", USER, (*PIPELINE, *GATE_COMMAND, *PROVISION),
    "seconds a download may wait for the server at a time",
)  # fmt: skip
NVIDIA_DRIVER_DOWNLOAD_DEADLINE = _setting(
    "NVIDIA_DRIVER_DOWNLOAD_DEADLINE", "9000", USER, (*PIPELINE, *GATE_COMMAND, *PROVISION),
    "seconds a whole download may take",
)  # fmt: skip
NVIDIA_DRIVER_DOWNLOAD_MIN_RATE = _setting(
    "NVIDIA_DRIVER_DOWNLOAD_MIN_RATE", "64K", USER, (*PIPELINE, *GATE_COMMAND, *PROVISION),
    "bytes a second (K, M) below which a download is given up; 0: no minimum",
)  # fmt: skip
NVIDIA_DRIVER_REDIRECT_HOSTS = _setting(
    "NVIDIA_DRIVER_REDIRECT_HOSTS",
    "Flatcar's hosts (provision: NVIDIA's)",
    USER,
    (*PIPELINE, *GATE_COMMAND, *PROVISION),
    "the hosts (or *.domain) redirects may go to, comma-separated; none: no redirects",
)
# Flatcar's releases (sources/flatcar.py, sources/verify.py).
FLATCAR_RELEASE_BASE_URL = _setting(
    "FLATCAR_RELEASE_BASE_URL", "https://{channel}.release.flatcar-linux.net",
    f"{USER}, {IMAGE} (precompiled build argument)", (*PIPELINE, *GATE_COMMAND),
    "Flatcar's release server, a URL template with {channel} (mirrors)",
)  # fmt: skip
FLATCAR_RELEASES_URL = _setting(
    "FLATCAR_RELEASES_URL", "https://www.flatcar.org/releases-json/releases.json", USER,
    GATE_COMMAND, "Flatcar's releases feed: which releases exist",
)  # fmt: skip
FLATCAR_KEYRING = _setting(
    "FLATCAR_KEYRING", "Flatcar's image signing key, shipped",
    f"{USER}, {IMAGE} (precompiled build argument)", (*PIPELINE, *GATE_COMMAND),
    "a keyring of one's own to verify Flatcar's releases with (mirrors)",
)  # fmt: skip
FLATCAR_SIGNING_KEY_URL = _setting(
    "FLATCAR_SIGNING_KEY_URL",
    "https://www.flatcar.org/security/image-signing-key/Flatcar_Image_Signing_Key.asc",
    USER,
    (*PIPELINE, *GATE_COMMAND),
    "where an expired shipped key is refreshed from; none: never",
)
# The reboot gate (deploy/reboot-gate, docs/gpu-operator.md).
POD_NAMESPACE = _setting(
    "POD_NAMESPACE", None, GATE, GATE_COMMAND, "the gate's namespace (kured: its pod; pre-pulls)"
)
POD_NAME = _setting("POD_NAME", None, GATE, GATE_COMMAND, "kured: the gate's pod, which it blocks")
GPU_OPERATOR_NAMESPACE = _setting(
    "GPU_OPERATOR_NAMESPACE", "gpu-operator", GATE, GATE_COMMAND,
    "where the Operator's pull secrets are (a ClusterPolicy has no namespace)",
)  # fmt: skip
REBOOT_GATE_ANNOTATION = _setting(
    "REBOOT_GATE_ANNOTATION", "gpu-driver-container/reboot-gate-ok", GATE, GATE_COMMAND,
    "FLUO: the node annotation that approves a reboot",
)  # fmt: skip
REBOOT_GATE_PREPULL = _setting(
    "REBOOT_GATE_PREPULL", "true", USER, GATE_COMMAND,
    "false: approve once the image is published, without pulling it to the node first",
)  # fmt: skip
REBOOT_GATE_API_SERVER = _setting(
    "REBOOT_GATE_API_SERVER", "the in-cluster API server", USER, GATE_COMMAND,
    "the Kubernetes API server's URL (http only to localhost: kubectl proxy)",
)  # fmt: skip
KUBERNETES_SERVICE_HOST = _setting(
    "KUBERNETES_SERVICE_HOST", None, "Kubernetes", GATE_COMMAND, "the in-cluster API server"
)
KUBERNETES_SERVICE_PORT = _setting(
    "KUBERNETES_SERVICE_PORT", "443", "Kubernetes", GATE_COMMAND, "its port"
)
REGISTRY_TOKEN_HOSTS = _setting(
    "REGISTRY_TOKEN_HOSTS", None, USER, GATE_COMMAND,
    "token services (hosts, comma-separated) a registry's pull secret may be sent to",
)  # fmt: skip
# Set for other readers: nothing in nvidia-driver reads these.
NVIDIA_VISIBLE_DEVICES = _setting(
    "NVIDIA_VISIBLE_DEVICES", "void", f"{IMAGE}, {OPERATOR}, {GATE}", (),
    "void: the pod gets no GPU of its own", "the NVIDIA Container Toolkit",
)  # fmt: skip
GDS_ENABLED = _setting(
    "GDS_ENABLED", None, OPERATOR, (), "recorded in .driver-ctr-ready",
    "the Operator's startup probe",
)  # fmt: skip
GDRCOPY_ENABLED = _setting(
    "GDRCOPY_ENABLED", None, OPERATOR, (), "recorded in .driver-ctr-ready",
    "the Operator's startup probe",
)  # fmt: skip
NODE_IP = _setting("NODE_IP", None, OPERATOR, (), "the node's address: not used", "nothing")
HTTPS_PROXY = _setting(
    "HTTPS_PROXY", None, USER, (),
    "the proxy for https downloads and registries, not the Kubernetes API (https_proxy too; "
    "HTTP_PROXY for http URLs)", "Python's urllib (sources/download.py, sources/http.py)",
)  # fmt: skip
NO_PROXY = _setting(
    "NO_PROXY", None, USER, (),
    "hosts, domains, addresses and CIDR ranges reached without the proxy, comma-separated "
    "(no_proxy too)", "Python's urllib; CIDR ranges: sources/exchange.py",
)  # fmt: skip
TMPDIR = _setting(
    "TMPDIR", "/tmp", USER, (),  # noqa: S108 - the default shown, not a file opened
    "scratch files; the gate needs it writable", "Python's tempfile",
)  # fmt: skip


def _readers(setting: Setting) -> str:
    commands = list(setting.commands)
    if set(DRIVER_COMMANDS) <= set(commands):  # all of them: named as a group
        commands = [
            "the driver commands",
            *(command for command in commands if command not in DRIVER_COMMANDS),
        ]
    return ", ".join(commands) or setting.reader


def _row(setting: Setting) -> tuple[str, str, str, str, str]:
    name = f"{setting.name}<FIELD>" if setting.name.endswith("_") else setting.name
    default = "" if setting.default is None else setting.default
    return name, default, setting.set_by, _readers(setting), setting.meaning


HEADER = ("variable", "default", "set by", "read by", "meaning")


def text() -> str:
    """The table for a terminal: a paragraph a variable."""
    paragraphs = []
    for setting in SETTINGS.values():
        name, default, set_by, read_by, meaning = _row(setting)
        paragraphs.append(
            "\n".join([
                f"{name}={default}" if default else name,
                textwrap.fill(meaning, 100, initial_indent="    ", subsequent_indent="    "),
                textwrap.fill(f"set by {set_by}; read by {read_by}", 100,
                              initial_indent="    ", subsequent_indent="    "),
            ])
        )  # fmt: skip
    return "\n".join(paragraphs) + "\n"


def markdown() -> str:
    """The table docs/settings.md carries."""

    def cells(row: tuple[str, ...]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"

    rows = [cells(HEADER), cells(("---",) * len(HEADER))]
    for setting in SETTINGS.values():
        name, default, set_by, read_by, meaning = _row(setting)
        rows.append(cells((f"`{name}`", default, set_by, read_by, meaning)))
    return "\n".join(rows) + "\n"
