"""The public surface and the one-way layering of the package."""

import ast
import subprocess
import sys
from pathlib import Path

import tuner

PKG = Path(tuner.__file__).parent


def test_public_api_is_pinned():
    assert tuner.__all__ == ["load_config", "run_study", "Config", "TunerError", "ConfigError", "HostError", "LaunchError", "MeasureError"]
    for name in tuner.__all__:
        assert getattr(tuner, name) is not None


def test_emulator_imports_nothing_of_the_tuner_and_no_tuner_dependencies():
    code = "import sys, sglang_emulator.__main__, sglang_emulator.server; bad = [m for m in ('optuna', 'fabric', 'openai', 'scipy', 'tuner.config') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(("." * node.level) + node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_third_party_libraries_stay_home():
    """optuna in the study layer, fabric/invoke in host/control, openai in measure."""
    homes = {
        "openai": {"measure.py"},
        "fabric": {"host.py"},
        "paramiko": {"host.py"},
        "invoke": {"host.py"},
    }
    for path in PKG.glob("*.py"):
        imports = _imports(path)
        for lib, allowed in homes.items():
            if any(i == lib or i.startswith(lib + ".") for i in imports):
                assert path.name in allowed, f"{path.name} imports {lib}"


def test_lower_layers_do_not_import_higher_ones():
    order = ["errors", "config", "space", "launch", "host", "control", "diagnose", "client", "readiness", "workload", "measure", "score", "study", "terminal", "optimize"]
    rank = {name: i for i, name in enumerate(order)}
    for path in PKG.glob("*.py"):
        me = path.stem
        if me not in rank:
            continue
        for imp in _imports(path):
            target = imp.lstrip(".").split(".")[0]
            if imp.startswith(".") and target in rank:
                assert rank[target] <= rank[me], f"{me} imports {target}"
