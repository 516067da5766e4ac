"""A simulated host for end-to-end tests of ``nvidia-driver``.

The host is a directory used as ``--host-root``; the external commands are recording stubs on
PATH that also act on that directory (modprobe creates /sys/module/<m>/refcnt, mount appends to
/proc/mounts, daemons write pid files of a real background process...).
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from nvidia_driver.kbuild.packages import PackageMetadata, write_package

KERNEL = "6.12.81-flatcar"
BANNER = (
    "Linux version 6.12.81-flatcar (build@pony-truck.infra.kinvolk.io) "
    "(x86_64-cros-linux-gnu-gcc (Gentoo Hardened 14.3.1_p20250801 p4) 14.3.1 20250801, "
    "GNU ld (Gentoo 2.45 p3) 2.45.0) #1 SMP PREEMPT_DYNAMIC Mon Apr 20 18:02:03 -00 2026"
)
# An arm64 Flatcar kernel's banner: the same release, built by Flatcar's aarch64 SDK compiler.
ARM64_BANNER = (
    "Linux version 6.12.81-flatcar (build@pony-truck.infra.kinvolk.io) "
    "(aarch64-cros-linux-gnu-gcc (Gentoo Hardened 14.3.1_p20250801 p4) 14.3.1 20250801, "
    "GNU ld (Gentoo 2.45 p3) 2.45.0) #1 SMP PREEMPT Mon Apr 20 18:02:03 -00 2026"
)
DRIVER = "580.105.08"

FLATCAR_OS_RELEASE_UNQUOTED = """\
NAME="Flatcar Container Linux by Kinvolk"
ID=flatcar
ID_LIKE=coreos
VERSION=4593.2.0
VERSION_ID=4593.2.0
BUILD_ID=2026-04-20-1802
SYSEXT_LEVEL=1.0
PRETTY_NAME="Flatcar Container Linux by Kinvolk 4593.2.0 (Oklo)"
ANSI_COLOR="38;5;75"
HOME_URL="https://flatcar.org/"
BUG_REPORT_URL="https://issues.flatcar.org"
FLATCAR_BOARD="amd64-usr"
CPE_NAME="cpe:2.3:o:flatcar-linux:flatcar_linux:4593.2.0:*:*:*:*:*:*:*"
"""

FLATCAR_OS_RELEASE_QUOTED = """\
NAME="Flatcar Container Linux by Kinvolk"
ID="flatcar"
ID_LIKE="coreos"
VERSION="4757.1.0"
VERSION_ID="4757.1.0"
BUILD_ID="2026-08-11-2350"
SYSEXT_LEVEL="1.0"
PRETTY_NAME="Flatcar Container Linux by Kinvolk 4757.1.0"
ANSI_COLOR="38;5;75"
HOME_URL="https://flatcar.org"
BUG_REPORT_URL="https://issues.flatcar.org"
SUPPORT_URL="https://groups.google.com/forum/#!forum/flatcar-linux-user"
FLATCAR_BOARD="amd64-usr"
CPE_NAME="cpe:2.3:o:flatcar-linux:flatcar_linux:4757.1.0:*:*:*:*:*:*:*"
"""

# PCI device ids.
H100 = 0x2330
L40S = 0x26B9
V100 = 0x1DB1
GB200 = 0x2941
B200 = 0x2901  # HGX B200 (open-gpu-kernel-modules README, compatible GPUs: 2901 10DE 1999)
GH200 = 0x2342  # NVIDIA/gpu-admin-tools gpu/devid_names.py: 0x2342 'GH200'
NVSWITCH = 0x22A3

_STUB_COMMON = r"""#!/bin/bash
name=$(basename "$0")
echo "$name $*" >> "$STUB_LOG"
root="$NVIDIA_DRIVER_HOST_ROOT"
if [ -e "$STUB_STATE/fail-$name" ]; then
  cat "$STUB_STATE/fail-$name" >&2
  exit 1
fi
sysmod() { echo "$root/sys/module/${1//-/_}"; }
daemonize() {  # a real process with a pid file, as the daemons leave behind
  mkdir -p "$(dirname "$1")"
  setsid sleep 300 >/dev/null 2>&1 </dev/null &
  echo $! > "$1"
}
"""

STUBS = {
    "modprobe": r"""
if [ "$1" = "-d" ]; then exit 0; fi   # host prerequisites from the host's own tree
for arg in "$@"; do
  case "$arg" in -*) continue;; esac
  mkdir -p "$(sysmod "$arg")" && echo 0 > "$(sysmod "$arg")/refcnt"
done
""",
    "rmmod": r"""
for arg in "$@"; do rm -rf "$(sysmod "$arg")"; done
""",
    "depmod": "",
    "chcon": "",
    "mount": r"""
if [ "$1" = "--rbind" ]; then echo "none $3 none rw 0 0" >> "$root/proc/mounts"; fi
""",
    "umount": r"""
target="${@: -1}"
grep -v " $target " "$root/proc/mounts" > "$root/proc/mounts.new" || true
mv "$root/proc/mounts.new" "$root/proc/mounts"
""",
    "nvidia-persistenced": r"""
echo "daemons-status-at-start $(cat "$root/run/nvidia/validations/.driver-daemons-status")" \
  >> "$STUB_LOG"
daemonize "$root/var/run/nvidia-persistenced/nvidia-persistenced.pid"
""",
    "nv-fabricmanager": r"""
cp "$2" "$STUB_STATE/fabricmanager.cfg.seen"
daemonize "$root/var/run/nvidia-fabricmanager/nv-fabricmanager.pid"
""",
    # As the fabric manager's own start script (NVLink5): NVLSM from /opt/nvidia/nvlsm, or it
    # aborts; then the fabric manager.
    "nvidia-fabricmanager-start.sh": r"""
nvlsm="$root/opt/nvidia/nvlsm/sbin/nvlsm"
while [ $# -gt 0 ]; do
  case "$1" in
    --fm-pid-file) fm_pid="$2"; shift;;
    --nvlsm-pid-file) nvlsm_pid="$2"; shift;;
    --nvlsm-config-file) nvlsm_config="$2"; shift;;
  esac
  shift
done
if [ ! -x "$nvlsm" ]; then echo '"/opt/nvidia/nvlsm/sbin/nvlsm" does not exist' >&2; exit 1; fi
"$nvlsm" --config "$nvlsm_config" --pid-file "$nvlsm_pid"
daemonize "$fm_pid"
""",
    "nvidia-imex": r"""
cp "$2" "$STUB_STATE/imex.cfg.seen"
exec sleep 300
""",
    "nvidia-smi": "",
    "ld": r"""
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then echo linked > "$2"; fi
  shift
done
""",
    "chroot": r"""
shift
if [ "$1" = "modprobe" ]; then
  shift
  mkdir -p "$(sysmod "$1")" && echo 0 > "$(sysmod "$1")/refcnt"
fi
""",
    "make": r"""
dir=.
while [ $# -gt 0 ]; do
  case "$1" in -C) dir="$2"; shift;; esac
  shift
done
for source in "$dir"/*.c; do echo "  CC [M]  ${source%.c}.o"; done
for module in nvidia nvidia-uvm nvidia-modeset nvidia-drm nvidia-peermem; do
  echo "built $module" > "$dir/$module.ko"
done
if [ -d "$dir/nvidia" ]; then  # the proprietary tree: objects for relinking on the node
  echo interface > "$dir/nvidia/nv-interface.o"
  echo interface > "$dir/nvidia-modeset/nv-modeset-interface.o"
  echo mod > "$dir/nvidia.mod.o"; echo mod > "$dir/nvidia-modeset.mod.o"
fi
""",
    "strip": "",
    "gcc-14": r"""
case "$1" in
  -dumpfullversion) echo 14.2.0;;
  --version) echo "gcc-14 (Debian 14.2.0-19) 14.2.0";;
esac
""",
    # Debian's cross toolchains (gcc-14-aarch64-linux-gnu, gcc-14-x86-64-linux-gnu).
    "aarch64-linux-gnu-gcc-14": r"""
case "$1" in
  -dumpfullversion) echo 14.2.0;;
  --version) echo "aarch64-linux-gnu-gcc-14 (Debian 14.2.0-19) 14.2.0";;
esac
""",
    "aarch64-linux-gnu-strip": "",
    "x86_64-linux-gnu-gcc-14": r"""
case "$1" in
  -dumpfullversion) echo 14.2.0;;
  --version) echo "x86_64-linux-gnu-gcc-14 (Debian 14.2.0-19) 14.2.0";;
esac
""",
    "x86_64-linux-gnu-strip": "",
}


@dataclass
class SimulatedHost:
    root: Path
    bin_dir: Path
    state: Path
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def log(self) -> Path:
        return self.state / "calls.log"

    def calls(self, name: str | None = None) -> list[str]:
        if not self.log.exists():
            return []
        lines = self.log.read_text().splitlines()
        return [line for line in lines if name is None or line.split(" ", 1)[0] == name]

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def write(self, absolute: str, text: str) -> Path:
        path = self.path(absolute)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    # -- host facts ---------------------------------------------------------------------------

    def set_kernel(self, release: str = KERNEL, banner: str = BANNER) -> None:
        self.write("/proc/version", banner + "\n")
        self.write("/proc/sys/kernel/osrelease", release + "\n")

    def set_os_release(self, text: str, *, symlink: bool = False) -> None:
        if symlink:
            # As on Flatcar: /etc/os-release -> ../usr/lib/os-release.
            self.write("/usr/lib/os-release", text)
            link = self.path("/host-etc/os-release")
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to("../usr/lib/os-release")
        else:
            self.write("/host-etc/os-release", text)

    def become_arm64(self, gpu: int, count: int = 4) -> None:
        """An arm64 node (GH200, GB200): its banner and board, TARGETARCH, only ``gpu``s."""
        self.set_kernel(banner=ARM64_BANNER)
        self.set_os_release(FLATCAR_OS_RELEASE_UNQUOTED.replace('"amd64-usr"', '"arm64-usr"'))
        self.extra_env["TARGETARCH"] = "arm64"
        devices = self.path("/sys/bus/pci/devices")
        for device in devices.iterdir() if devices.is_dir() else []:
            for name in ("vendor", "device", "class"):
                (device / name).unlink()
            device.rmdir()
        self.add_gpus(gpu, count)

    def add_pci(self, address: str, vendor: int, device: int, pci_class: int) -> None:
        base = f"/sys/bus/pci/devices/{address}"
        self.write(f"{base}/vendor", f"0x{vendor:04x}\n")
        self.write(f"{base}/device", f"0x{device:04x}\n")
        self.write(f"{base}/class", f"0x{pci_class:06x}\n")

    def add_gpus(self, device: int, count: int = 1) -> None:
        for index in range(count):
            self.add_pci(f"0000:{0x18 + index:02x}:00.0", 0x10DE, device, 0x030200)

    def add_nvswitches(self, count: int = 4) -> None:
        for index in range(count):
            self.add_pci(f"0000:{0x80 + index:02x}:00.0", 0x10DE, NVSWITCH, 0x068000)
            # Appears once nvidia.ko is loaded; the simulated host has it from the start.
            self.write(f"/proc/driver/nvidia-nvswitch/devices/0000:{0x80 + index:02x}:00.0", "")

    def add_nvlink5_port(self, name: str = "mlx5_0") -> None:
        path = self.path(f"/sys/class/infiniband/{name}/device/vpd")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x82\x10ConnectX-7 LPF\x90\x20PN:MCX750\x00SMDL=SW_MNG\x78")

    def add_mellanox_nic(self) -> None:
        self.add_pci("0000:c1:00.0", 0x15B3, 0x1021, 0x020700)  # ConnectX-7

    def add_ofa_kernel(self, release: str = KERNEL) -> Path:
        """MOFED's kernel tree as the network operator's driver container mounts it."""
        tree = f"/run/mellanox/drivers/usr/src/ofa_kernel/x86_64/{release}"
        self.write(f"{tree}/Module.symvers", "0x12345678\tib_register_peer_memory_client\n")
        self.write(f"{tree}/include/rdma/peer_mem.h", "/* MOFED */\n")
        # What the MOFED container links to its own alternatives: meaningless here.
        default = self.path("/run/mellanox/drivers/usr/src/ofa_kernel/default")
        default.symlink_to("/etc/alternatives/ofa_kernel_headers")
        return self.path(tree)

    def add_nvlsm(self) -> None:
        """NVLSM where its redist archive puts it in the image (redist.py)."""
        nvlsm = self.write(
            "/opt/nvidia/nvlsm/sbin/nvlsm",
            "#!/bin/bash\n"
            'echo "nvlsm $*" >> "$STUB_LOG"\n'
            'while [ $# -gt 0 ]; do [ "$1" = --pid-file ] && pid="$2"; shift; done\n'
            'mkdir -p "$(dirname "$pid")"\n'
            'setsid sleep 300 >/dev/null 2>&1 </dev/null & echo $! > "$pid"\n',
        )
        nvlsm.chmod(0o755)
        self.write("/usr/share/nvidia/nvlsm/nvlsm.conf", "LOG_LEVEL 3\n")

    def set_module(self, name: str, refcnt: int = 0) -> None:
        self.write(f"/sys/module/{name}/refcnt", f"{refcnt}\n")

    def is_loaded(self, name: str) -> bool:
        return self.path(f"/sys/module/{name}/refcnt").exists()

    def set_lockdown(self, mode: str) -> None:
        choices = ["none", "integrity", "confidentiality"]
        self.write(
            "/sys/kernel/security/lockdown",
            " ".join(f"[{c}]" if c == mode else c for c in choices) + "\n",
        )

    # -- image contents -----------------------------------------------------------------------

    def add_package(
        self,
        module_type: str = "open",
        banner: str = BANNER,
        driver: str = DRIVER,
        kernel: str = KERNEL,
    ) -> Path:
        sources = self.state / "package-sources" / module_type
        sources.mkdir(parents=True, exist_ok=True)
        modules = ["nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko", "nvidia-peermem.ko"]
        for module in modules:
            (sources / module).write_text(f"{module_type} {module}\n")
        metadata = PackageMetadata(
            banner=banner,
            kernel_release=kernel,
            driver_version=driver,
            module_type=module_type,
            compiler="x86_64-cros-linux-gnu-gcc (Gentoo Hardened 14.3.1_p20250801 p4) 14.3.1",
            source_digest="sha256:0",
            modules=modules,
            flatcar_version="4593.2.0",
        )
        destination = self.path(f"/opt/nvidia/precompiled/{module_type}/{kernel}")
        return write_package(destination, metadata, {m: sources / m for m in modules}).path

    def add_driver_sources(self, driver: str = DRIVER) -> None:
        for directory in ("kernel-open", "kernel"):
            base = f"/usr/src/nvidia-{driver}/{directory}"
            self.write(f"{base}/Makefile", "modules:\n")
            for source in ("nv.c", "nv-pci.c", "nvidia-uvm.c"):
                self.write(f"{base}/{source}", "/* source */\n")
        self.write(f"/usr/src/nvidia-{driver}/kernel/nvidia/nv-kernel.o_binary", "core\n")
        self.write(
            f"/usr/src/nvidia-{driver}/kernel/nvidia-modeset/nv-modeset-kernel.o_binary", "core\n"
        )

    def add_gsp_firmware(self, driver: str = DRIVER) -> None:
        for name in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
            self.write(f"/opt/lib/firmware/nvidia/{driver}/{name}", f"{name} of {driver}\n")

    def add_host_kernel_tree(
        self,
        release: str = KERNEL,
        gcc: int = 140201,
        *,
        split_source: bool = False,
        arch: str | None = None,
    ) -> Path:
        """The node's tree; split_source: LTS 4081's cleaned build/ and stripped source/; arch:
        the .config names it (CONFIG_X86_64 or CONFIG_ARM64) as real trees do."""
        tree = f"/proc/1/root/usr/lib/modules/{release}/build"
        self.write(f"{tree}/Makefile", "# kernel\n")
        self.write(f"{tree}/Module.symvers", "0x00000000\tprintk\tvmlinux\tEXPORT_SYMBOL\t\n")
        self.write(f"{tree}/scripts/module.lds", "SECTIONS {}\n")
        if split_source:
            self.write(f"/proc/1/root/usr/lib/modules/{release}/source/Makefile", "# source\n")
        triplet = "aarch64" if arch == "arm64" else "x86_64"
        symbol = {"amd64": "CONFIG_X86_64=y\n", "arm64": "CONFIG_ARM64=y\n"}.get(arch or "", "")
        self.write(
            f"{tree}/.config",
            f'CONFIG_CC_VERSION_TEXT="{triplet}-cros-linux-gnu-gcc (Gentoo) 14.2.1"\n'
            f"CONFIG_GCC_VERSION={gcc}\n{symbol}",
        )
        return self.path(tree)

    # -- running ------------------------------------------------------------------------------

    def env(self, **overrides: str) -> dict[str, str]:
        env = {
            "PATH": f"{self.bin_dir}:/usr/bin:/bin",
            "NVIDIA_DRIVER_HOST_ROOT": str(self.root),
            "STUB_LOG": str(self.log),
            "STUB_STATE": str(self.state),
            "DRIVER_VERSION": DRIVER,
            "TARGETARCH": "amd64",
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
            **overrides,
        }
        return {key: value for key, value in env.items() if value is not None}

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "nvidia_driver", *args],
            capture_output=True,
            text=True,
            env=self.env(**env),
            timeout=60,
            check=False,
        )

    def start(self, *args: str, **env: str) -> RunningDriver:
        process = subprocess.Popen(
            [sys.executable, "-m", "nvidia_driver", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env(**env),
        )
        return RunningDriver(process)

    def fail(self, command: str, reason: str) -> None:
        (self.state / f"fail-{command}").write_text(reason + "\n")

    def daemon_pids(self) -> list[int]:
        pids = []
        for pid_file in (
            self.path("/var/run").rglob("*.pid") if self.path("/var/run").exists() else []
        ):
            text = pid_file.read_text().strip()
            if text.isdigit():
                pids.append(int(text))
        return pids


class RunningDriver:
    """An ``init`` running in the background, with its output collected line by line."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        if any(text in line for line in self.lines):
            return
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            if text in line:
                return
        output = "\n".join(self.lines)
        raise AssertionError(f"{text!r} not seen; output so far:\n{output}")

    def terminate(self, timeout: float = 30) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.finish(timeout)

    def finish(self, timeout: float = 30) -> int:
        code = self.process.wait(timeout)
        self._reader.join(timeout)
        while not self._queue.empty():
            line = self._queue.get()
            if line is not None:
                self.lines.append(line)
        assert self.process.stdout is not None
        self.process.stdout.close()
        return code

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def install_stubs(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, body in STUBS.items():
        stub = bin_dir / name
        stub.write_text(_STUB_COMMON + textwrap.dedent(body))
        stub.chmod(0o755)
