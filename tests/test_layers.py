"""The layers of the house (DESIGN.md §2, issue "one job per layer"): every import, function-local ones included,
points down, and no two files import each other, directly or through others.

The layers, lowest first; a unit is `costmodels`, a subpackage or top-level module of `autopar`:

    costmodels                                    specs, cost terms, rules, scoring one plan (numpy and pyyaml only)
    atomic_write                                  the one writer of every file autopar writes (temp, fsync, rename)
    errors, models, megatron_args                 inputs: error channels, model configs, launch commands
    bridge_config                                 Megatron-Bridge configs, read through the launch-command reader
    runs                                          measured runs: autopar's run format, the layout a run is priced at
    run_logs, calibrate                           training logs read as runs; hardware profiles (measured, fitted)
    results, remedies                             answers as plain typed data; the guide's memory remedies
    search                                        space, oracle, CP-SAT, Pareto front, explanations
    export                                        launch configs of a plan
    report                                        formatting only: terminal, JSON, CSV, Markdown, HTML
    commands, api                                 CLI flags in, results out; the API's constructors
    cli, autopar (the package face)               entry points
    autopar.__main__

A unit may import units of lower layers only (not its own layer's other units). A new unit must be given a layer
here: the test names it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(units) for units in (
    {"costmodels"},
    {"autopar.atomic_write"},
    {"autopar.errors", "autopar.models", "autopar.megatron_args"},
    {"autopar.bridge_config"},
    {"autopar.runs"},
    {"autopar.run_logs", "autopar.calibrate"},
    {"autopar.results", "autopar.remedies"},
    {"autopar.search"},
    {"autopar.export"},
    {"autopar.report"},
    {"autopar.commands", "autopar.api"},
    {"autopar.cli", "autopar"},
    {"autopar.__main__"},
))
LAYER_OF = {unit: index for index, units in enumerate(LAYERS) for unit in units}


def module_files() -> dict[str, Path]:
    files = {}
    for package in ("autopar", "costmodels"):
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path
    return files


def imported_modules(module: str, path: Path, files: dict[str, Path]) -> set[str]:
    """Project modules `module` imports anywhere in its body (top level, functions, TYPE_CHECKING blocks)."""
    def resolve(name: str) -> str | None:
        while name:
            if name in files:
                return name
            name = name.rpartition(".")[0]
        return None

    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            prefix = node.module or ""
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (path.name == "__init__.py")]
                prefix = ".".join(base + ([node.module] if node.module else []))
            names = [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {target for target in map(resolve, names) if target and target != module}
    return found


def unit_of(module: str) -> str:
    parts = module.split(".")
    return "costmodels" if parts[0] == "costmodels" else ".".join(parts[:2])


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {module: imported_modules(module, path, files) for module, path in files.items()}


def test_every_unit_has_a_layer():
    units = {unit_of(module) for module in module_files()}
    assert units - set(LAYER_OF) == set(), "give these units a layer in tests/test_layers.py"


def test_imports_point_down_the_layers():
    upward = sorted(f"{module} -> {target} ({unit_of(module)} is layer {LAYER_OF[unit_of(module)]}, "
                    f"{unit_of(target)} is layer {LAYER_OF[unit_of(target)]})"
                    for module, targets in import_graph().items() for target in targets
                    if unit_of(module) != unit_of(target)
                    and LAYER_OF.get(unit_of(target), -1) >= LAYER_OF.get(unit_of(module), -1))
    assert upward == []


def test_no_file_imports_itself_through_others():
    graph = import_graph()
    cycles = []
    for start in graph:      # a depth-first walk from each file; small graph (~100 files)
        stack, seen = [(start, (start,))], set()
        while stack:
            module, path = stack.pop()
            for target in graph.get(module, ()):
                if target == start:
                    cycles.append(" -> ".join(path + (start,)))
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, path + (target,)))
    assert cycles == []


def test_the_scan_sees_function_local_imports(tmp_path):
    # the scan must not miss the imports the issue found hidden inside functions
    source = tmp_path / "example.py"
    source.write_text("def f():\n    from autopar.report import render\n    import costmodels.plan\n")
    files = module_files()
    assert imported_modules("autopar.example", source, files) == {"autopar.report", "costmodels.plan"}


def test_costmodels_needs_no_autopar_and_no_heavy_library():
    heavy = ("autopar", "ortools", "transformers", "torch", "rich")
    offenders = []
    for path in (ROOT / "costmodels").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{path.relative_to(ROOT)}: {name}" for name in names if name.split(".")[0] in heavy]
    assert offenders == []
