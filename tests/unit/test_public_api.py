"""The public surface and the one-way layering of the package: every module of `tuner` has a
layer, and imports only from its own layer or below.  Adding an arrow the wrong way fails here."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import tuner

ROOT = Path(tuner.__file__).parent.parent
PKG = ROOT / "tuner"

# Lowest first.  The four rooms may use errors/sglang_args/config; measure may read the target's
# HTTP client; results reads measurements; search reads results; the sequence, the trial and
# the study sit above the rooms; the command-line modules on top.
LAYERS = [
    ("tuner.errors", "tuner.interrupts"),
    ("tuner.sglang_args",),
    ("tuner.config",),
    ("tuner.server",),
    ("tuner.measure",),
    ("tuner.results",),
    ("tuner.search",),
    ("tuner.progress", "tuner.sequence"),
    ("tuner.trial",),
    ("tuner.study", "tuner.adaptive"),
    ("tuner.cli", "tuner.output"),
    ("tuner.optimize", "tuner.bench", "tuner.best", "tuner.report", "tuner.dashboard", "tuner.schedule",
     "tuner.__main__", "tuner"),
]


def _layer(module: str) -> int:
    best, rank = "", None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > len(best):
                best, rank = name, i
    assert rank is not None, f"{module} has no layer: add it to LAYERS in {__file__}"
    return rank


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, *, absolute_only: bool = True) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0 or not absolute_only, f"{path}: relative import; use tuner.<room>.<module>"
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


MODULES = sorted(PKG.rglob("*.py"))


def test_public_api_is_pinned():
    assert tuner.__all__ == ["load_config", "run_study", "Config", "TunerError", "ConfigError", "HostError", "LaunchError", "MeasureError"]
    for name in tuner.__all__:
        assert getattr(tuner, name) is not None


@pytest.mark.parametrize("path", MODULES, ids=lambda p: _module(p))
def test_every_module_imports_only_its_layer_or_below(path):
    me = _module(path)
    mine = _layer(me)
    for imp in _imports(path):
        if imp == "tuner" or imp.startswith("tuner."):
            assert _layer(imp) <= mine, f"{me} (layer {mine}) imports {imp} (layer {_layer(imp)})"
        assert not imp.startswith("sglang_emulator"), f"{me} imports the emulator"


def test_measure_and_target_do_not_know_optuna_and_libraries_stay_home():
    homes = {"openai": ("tuner.measure.wire",), "fabric": ("tuner.server.host",), "paramiko": ("tuner.server.host",),
             "invoke": ("tuner.server.host",), "optuna": ("tuner.results", "tuner.search", "tuner.progress", "tuner.trial",
             "tuner.study", "tuner.adaptive", "tuner.optimize", "tuner.output", "tuner.best", "tuner.report", "tuner.dashboard", "tuner.schedule")}
    for path in MODULES:
        me = _module(path)
        for imp in _imports(path):
            for lib, allowed in homes.items():
                if imp == lib or imp.startswith(lib + "."):
                    assert any(me == a or me.startswith(a + ".") for a in allowed), f"{me} imports {lib}"


def test_the_emulator_imports_nothing_of_the_tuner_and_no_tuner_dependencies():
    for path in (ROOT / "sglang_emulator").rglob("*.py"):
        assert not any(i == "tuner" or i.startswith("tuner.") for i in _imports(path, absolute_only=False)), path
    code = "import sys, sglang_emulator.__main__, sglang_emulator.server; bad = [m for m in ('optuna', 'fabric', 'openai', 'scipy', 'tuner') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


EMULATOR_MAX_LINES = 80
# Longer today, in code other work of this round is changing (the memory model): pinned at its
# length, so it may shrink but not grow; split it next.
EMULATOR_PINNED = {"sglang_emulator.model.size_memory": 184}


def test_no_function_of_the_emulator_is_longer_than_eighty_lines():
    long = []
    for path in sorted((ROOT / "sglang_emulator").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name, lines = f"{_module(path)}.{node.name}", node.end_lineno - node.lineno + 1
                if lines > EMULATOR_PINNED.get(name, EMULATOR_MAX_LINES):
                    long.append(f"{name}: {lines} lines")
    assert not long, long


def test_no_function_outside_the_emulator_is_longer_than_sixty_lines():
    long = []
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
                long.append(f"{_module(path)}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not long, long


def test_every_name_a_module_exports_exists():
    """`from module import *` and the documentation rely on `__all__`; a name listed but not
    defined (the report once listed Choice and Plot without importing them) fails here."""
    import importlib

    missing = []
    for path in MODULES:
        if path.name == "__main__.py":
            continue
        module = importlib.import_module(_module(path))
        missing += [f"{_module(path)}.{name}" for name in getattr(module, "__all__", []) if not hasattr(module, name)]
    assert not missing, missing


def _literal_attr_keys(path: Path, record_keys: set[str]) -> list[str]:
    """Trial/study attribute keys written as string literals: `x.user_attrs["k"]`,
    `x.user_attrs.get("k")`, `"k" in x.user_attrs`, `set_user_attr("k", ...)`, and a record
    key read from a copy of the attrs (`attrs.get("fail_reason")`)."""
    def attrs_of(node) -> str | None:
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        return name if name in ("user_attrs", "attrs") else None

    def literal(node) -> str | None:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        key, holder = None, None
        if isinstance(node, ast.Subscript):
            key, holder = literal(node.slice), attrs_of(node.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr == "get":
                key, holder = literal(node.args[0]), attrs_of(node.func.value)
            elif node.func.attr == "set_user_attr":
                key, holder = literal(node.args[0]), "user_attrs"
        elif isinstance(node, ast.Compare) and len(node.comparators) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            key, holder = literal(node.left), attrs_of(node.comparators[0])
        if key is not None and (holder == "user_attrs" or (holder == "attrs" and key in record_keys)):
            found.append(f"{_module(path)}:{node.lineno}: {key!r}")
    return found


def test_every_attribute_key_is_named_in_record_only():
    """tuner/results/record.py is the one home of the attribute keys: a literal key anywhere else
    is a second home (a typo there reads None forever); use `record.<KEY>`."""
    from tuner.results import record

    keys = {getattr(record, n) for n in record.__all__ if n.isupper() and isinstance(getattr(record, n), str)}
    sources = [p for p in MODULES if p.name != "record.py"] + sorted((ROOT / "objectives").glob("*.py"))
    literals = [hit for path in sources for hit in _literal_attr_keys(path, keys)]
    assert not literals, literals


COMMANDS = ("optimize", "bench", "best", "schedule", "report", "dashboard")


def test_command_modules_stay_thin():
    """A command parses, calls one library function and prints through tuner/output.py; what
    grows past ~120 lines belongs in the library (the run in tuner/adaptive.py, the plan in
    tuner/search/preview.py, the reporters in tuner/progress.py)."""
    long = {name: n for name in COMMANDS if (n := len((PKG / f"{name}.py").read_text().splitlines())) > 120}
    assert not long, long
