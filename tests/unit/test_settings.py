"""The registry of environment variables (nvidia_driver.settings) is the code's: every variable
the package reads is in it, nothing in it is left unread, and docs/settings.md is made from it.

The package is read as source: an environment read is ``env.get(NAME)``, ``env[NAME]``,
``NAME in env``, ``os.getenv(NAME)``, or a call handed both an environment and a NAME (a helper
such as ``_flag(env, NAME)``), where the environment is ``env``/``environ`` (``os.environ``,
``self.commands.env``, ...) and NAME a literal or a constant of the module or of settings.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nvidia_driver import cli, settings
from nvidia_driver.gate.main import CACHE, OPERATOR_NAMESPACE, WORK
from nvidia_driver.gate.managers import APPROVAL
from nvidia_driver.paths import Paths
from nvidia_driver.settings import SETTINGS
from nvidia_driver.sources import download, flatcar
from nvidia_driver.sources.signingkey import FLATCAR_KEY_URL

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "entrypoint" / "src" / "nvidia_driver"
DOCS = ROOT / "docs" / "settings.md"
# The driver container the real Operator v25.3.4 renders.
OPERATOR_ENV = ROOT / "tests/integration/data/gpu-operator-v25.3.4-nvidia-driver-ctr.json"
ENVIRONMENTS = {"env", "environ"}  # the environment, however it is handed down
VARIABLE = re.compile(r"[A-Z][A-Z0-9_]*")
READERS = {"get", "pop", "setdefault"}
# `python -m nvidia_driver.image.provision`: the image build's downloads, not a subcommand.
OTHER_COMMANDS = {"provision"}
BEGIN = "<!-- BEGIN settings: made by `nvidia-driver settings --markdown`; edit settings.py -->"
END = "<!-- END settings -->"


def _environment(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ENVIRONMENTS
    return isinstance(node, ast.Attribute) and node.attr in ENVIRONMENTS


class _Scan(ast.NodeVisitor):
    """The variables one module reads: (line, name), and the reads whose name it cannot tell."""

    def __init__(self, tree: ast.Module) -> None:
        self.constants: dict[str, str] = {}
        for node in ast.walk(tree):  # the command line imports settings inside its functions
            if isinstance(node, ast.ImportFrom) and node.module == "nvidia_driver.settings":
                for alias in node.names:
                    value = getattr(settings, alias.name)
                    if isinstance(value, str):
                        self.constants[alias.asname or alias.name] = value
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                for target in node.targets:
                    if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                        self.constants[target.id] = node.value.value
        self.parameters: list[set[str]] = []
        self.found: list[tuple[int, str]] = []
        self.hidden: list[tuple[int, str]] = []

    def _value(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return self.constants.get(node.id)
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "settings"
        ):
            value = getattr(settings, node.attr, None)
            return value if isinstance(value, str) else None
        return None

    def _read(self, key: ast.expr) -> None:
        value = self._value(key)
        if value is not None:
            self.found.append((key.lineno, value))
        elif not (isinstance(key, ast.Name) and any(key.id in p for p in self.parameters)):
            # A helper's parameter is no read of its own: its callers name the variable.
            self.hidden.append((key.lineno, ast.unparse(key)))

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        arguments = node.args
        every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
        self.parameters.append({argument.arg for argument in every})
        self.generic_visit(node)
        self.parameters.pop()

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.visit_FunctionDef(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in READERS and _environment(func.value):
            if node.args:
                self._read(node.args[0])
        elif isinstance(func, ast.Attribute | ast.Name) and (
            (func.attr if isinstance(func, ast.Attribute) else func.id) == "getenv"
        ):
            self._read(node.args[0])
        elif isinstance(func, ast.Attribute) and func.attr == "startswith" and node.args:
            value = self._value(node.args[0])
            if value in SETTINGS:  # a prefix: NVFM_CONFIG_<FIELD>
                self.found.append((node.lineno, value))
        else:
            given = [*node.args, *(keyword.value for keyword in node.keywords)]
            if any(_environment(argument) for argument in given):
                for argument in given:
                    value = self._value(argument)
                    if value is not None and VARIABLE.fullmatch(value):
                        self.found.append((argument.lineno, value))
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if _environment(node.value):
            self._read(node.slice)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if any(isinstance(op, ast.In | ast.NotIn) for op in node.ops) and any(
            _environment(right) for right in node.comparators
        ):
            self._read(node.left)
        self.generic_visit(node)


def scan(text: str) -> _Scan:
    tree = ast.parse(text)
    reads = _Scan(tree)
    reads.visit(tree)
    return reads


def _package() -> dict[str, _Scan]:
    return {
        str(path.relative_to(SOURCE.parent)): scan(path.read_text(encoding="utf-8"))
        for path in sorted(SOURCE.rglob("*.py"))
    }


def _read_names() -> set[str]:
    return {name for reads in _package().values() for _, name in reads.found}


def test_every_variable_the_code_reads_is_registered() -> None:
    missing = [
        f"{module}:{line}: {name}"
        for module, reads in _package().items()
        for line, name in reads.found
        if name not in SETTINGS
    ]
    assert not missing, "add these to nvidia_driver/settings.py:\n" + "\n".join(missing)


def test_every_read_names_its_variable() -> None:
    hidden = [
        f"{module}:{line}: {key}"
        for module, reads in _package().items()
        for line, key in reads.hidden
    ]
    assert not hidden, "read these by a name from nvidia_driver.settings:\n" + "\n".join(hidden)


def test_every_registered_variable_is_read_by_what_the_registry_says() -> None:
    read = _read_names()
    unread = [name for name, entry in SETTINGS.items() if entry.commands and name not in read]
    assert not unread, f"nothing reads {unread}: remove them from nvidia_driver/settings.py"
    elsewhere = [name for name, entry in SETTINGS.items() if not entry.commands]
    assert all(SETTINGS[name].reader for name in elsewhere), "say what reads them"
    assert not read & set(elsewhere), "the code reads these: name the commands"


def test_the_scan_sees_every_kind_of_read() -> None:
    reads = scan(
        "import os\n"
        "from nvidia_driver.settings import NVFM_CONFIG_, USE_HOST_MOFED as MOFED\n"
        "LOCAL = 'LOCAL_NAME'\n"
        "def f(env, name):\n"
        "    os.environ['A']; os.getenv('B'); env.get(MOFED); self.commands.env.get(LOCAL)\n"
        "    'C' in env; _flag(env, 'D'); key.startswith(NVFM_CONFIG_); env.get(name)\n"
        "    environ.get(other); env.get('E', 'not a variable')\n"
    )
    assert sorted(name for _, name in reads.found) == sorted(
        ["A", "B", "USE_HOST_MOFED", "LOCAL_NAME", "C", "D", "NVFM_CONFIG_", "E"]
    )
    assert reads.hidden == [(7, "other")]


def test_the_registry_names_the_cli_s_commands() -> None:
    named = {command for entry in SETTINGS.values() for command in entry.commands}
    assert named <= set(cli.SUBCOMMANDS) | OTHER_COMMANDS
    assert all(constant == getattr(settings, constant) for constant in SETTINGS)


def test_the_defaults_are_the_code_s() -> None:
    def default(name: str) -> str:
        return SETTINGS[name].default or ""

    assert default("NVIDIA_DRIVER_DOWNLOAD_TIMEOUT") == f"{download.DEFAULT_TIMEOUT:g}"
    assert default("NVIDIA_DRIVER_DOWNLOAD_DEADLINE") == f"{download.DEFAULT_DEADLINE:g}"
    assert default("NVIDIA_DRIVER_DOWNLOAD_MIN_RATE") == f"{download.DEFAULT_MIN_RATE >> 10}K"
    assert default("FLATCAR_RELEASE_BASE_URL") == flatcar.DEFAULT_RELEASE_BASE_URL
    assert default("FLATCAR_RELEASES_URL") == flatcar.DEFAULT_RELEASES_URL
    assert default("FLATCAR_SIGNING_KEY_URL") == FLATCAR_KEY_URL
    assert default("GPU_OPERATOR_NAMESPACE") == OPERATOR_NAMESPACE
    assert default("REBOOT_GATE_ANNOTATION") == APPROVAL
    paths = Paths(Path("/"))
    assert default("NVIDIA_DRIVER_CACHE_DIR") == f"{paths.build_cache} (gate: {CACHE})"
    assert default("NVIDIA_DRIVER_WORK_DIR") == f"{paths.work_cache} (gate: {WORK})"


def _manifest_env(path: Path) -> set[str]:
    names = set()
    for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        pod = ((document or {}).get("spec") or {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            names |= {variable["name"] for variable in container.get("env", [])}
    return names


@pytest.mark.parametrize(
    "path",
    [OPERATOR_ENV, *sorted((ROOT / "deploy" / "reboot-gate").rglob("*.yaml"))],
    ids=lambda path: str(path.relative_to(ROOT)),
)
def test_what_the_operator_and_the_gate_s_manifests_set_is_registered(path: Path) -> None:
    if path.suffix == ".json":
        names = {variable["name"] for variable in json.loads(path.read_text())["env"]}
    else:
        names = _manifest_env(path)
    assert names <= set(SETTINGS), f"add {sorted(names - set(SETTINGS))} to settings.py"


def test_the_docs_carry_the_registry_s_table() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert BEGIN in text, f"{DOCS.name} lost its {BEGIN!r} mark"
    assert END in text, f"{DOCS.name} lost its {END!r} mark"
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
    assert table == settings.markdown(), (
        "docs/settings.md is stale: replace its table with the output of "
        "`PYTHONPATH=entrypoint/src python -m nvidia_driver settings --markdown`"
    )


def test_the_settings_command_lists_every_variable() -> None:
    command = [sys.executable, "-m", "nvidia_driver", "settings"]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    listed = {line.split("=", 1)[0] for line in output.splitlines() if line[:1].isupper()}
    assert listed == {name + "<FIELD>" if name.endswith("_") else name for name in SETTINGS}
    assert "NVIDIA_DRIVER_HOST_ROOT=/" in output.splitlines()
