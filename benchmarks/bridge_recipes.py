"""Build every Megatron-Bridge performance recipe and write its ConfigContainer as YAML (what Bridge itself writes with
`ConfigContainer.to_yaml`, saves beside a run as run_config.yaml and reads back with `from_yaml`), for
benchmarks/recipes_fit.py to read through autopar's reader (autopar.bridge_config).

    .venv-conformance/bin/python benchmarks/bridge_recipes.py OUT_DIR

Runs under the conformance venv (megatron-bridge 0.6.2 and megatron-core 0.19.2 installed as .ci/run installs
them). Each recipe is a function `<model>_<task>_<N>gpu_<gpu>_<precision>_config()` in
megatron/bridge/perf_recipes/<family>/<gpu>/<file>.py; it is called as Bridge's launcher calls it, and the GPU and
GPU count come from its name and folder. OUT_DIR gets one `<function>.yaml` per recipe built and `index.json`: for
every recipe its module, function, GPU, GPU count, its docstring's first line, and the yaml file or the error that
stopped it.

What this machine lacks, and the stand-ins it gets (nothing a recipe sets is changed):
- Transformer Engine and three packages Bridge imports at module level for other features (megatron-energon,
  diffusers, NVIDIA modelopt) are not installable on a CPU machine / Python 3.11: their imports get empty stand-in
  modules. The recipe functions only build dataclasses; no layer is constructed.
- typing.override (Python 3.12) comes from typing_extensions, as autopar.export.conformance does.
- the recipes read each model's config.json from the Hugging Face Hub (AutoBridge.from_hf_pretrained); with no
  network, the config.json files autopar bundles (autopar/presets/*.json, copies of the Hub's files, each with its
  source address) are laid out as an offline Hub cache under the ids the recipes ask for. A recipe whose model
  autopar does not bundle fails to build, and index.json says so.
"""

from __future__ import annotations

import abc
import importlib
import importlib.abc
import importlib.machinery
import inspect
import json
import os
import pkgutil
import re
import sys
import tempfile
import traceback
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAND_IN_PACKAGES = ("transformer_engine", "transformer_engine_torch", "megatron.energon", "diffusers", "modelopt")
"""Packages imported at module level by megatron-bridge that a CPU machine does not have (see the module docstring)."""
RECIPE_NAME = re.compile(r"_(\d+)gpu_([a-z0-9]+)_")


class _StandInClass(abc.ABCMeta):
    """A stand-in class: any attribute is another stand-in class; calling it returns one (or, as a decorator, the
    function it decorates)."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StandInClass(name, (), {})

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _StandInClass("instance", (), {})


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _StandInClass(name, (), {})
        setattr(self, name, value)
        return value


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if any(name == root or name.startswith(root + ".") for root in STAND_IN_PACKAGES):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"
        return module

    def exec_module(self, module) -> None:
        return None


def offline_hub_cache(root: Path) -> None:
    """autopar's bundled config.json files as a Hugging Face Hub cache under `root` (HF_HOME), under their own ids and
    the older names of HUB_RENAMES."""
    ids: dict[str, Path] = {}
    for preset in sorted((REPO / "autopar" / "presets").glob("*.json")):
        source = json.loads(preset.read_text()).get("autopar_source", "")
        match = re.match(r"https://huggingface\.co/([^/]+/[^/]+)/", source)
        if match:
            ids[match.group(1)] = preset
    from autopar.models import HUB_RENAMES     # repositories renamed since the recipes were written

    for old, new in HUB_RENAMES.items():
        if new in ids:
            ids[old] = ids[new]
    main = "0" * 40
    pinned = pinned_revisions()
    for repo_id, preset in ids.items():
        folder = root / "hub" / ("models--" + repo_id.replace("/", "--"))
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "main").write_text(main)
        for revision in {main} | pinned.get(repo_id, set()):
            (folder / "snapshots" / revision).mkdir(parents=True, exist_ok=True)
            (folder / "snapshots" / revision / "config.json").write_text(preset.read_text())


def pinned_revisions() -> dict[str, set[str]]:
    """Hub commits some recipes pin (`<NAME>_MODEL_ID = "org/model"` beside `<NAME>_MODEL_REVISION = "<sha>"` in
    megatron/bridge/recipes): the bundled config.json (the file at the repository's main) is laid out under them too;
    a model's config.json does not change between the commits of its weights' repository in the fields autopar reads."""
    import importlib.util

    spec = importlib.util.find_spec("megatron.bridge")
    out: dict[str, set[str]] = {}
    if spec is None or not spec.submodule_search_locations:
        return out
    for source in Path(list(spec.submodule_search_locations)[0], "recipes").rglob("*.py"):
        text = source.read_text(errors="replace")
        ids = dict(re.findall(r'^(\w+)_MODEL_ID\s*=\s*"([^"]+)"', text, re.MULTILINE))
        for prefix, sha in re.findall(r'^(\w+)_MODEL_REVISION\s*=\s*"([0-9a-f]{40})"', text, re.MULTILINE):
            if prefix in ids:
                out.setdefault(ids[prefix], set()).add(sha)
    return out


RECIPE_PRECISION = re.compile(r"_\d+gpu_[a-z0-9]+_([a-z0-9]+)")
"""`<model>_<task>_<N>gpu_<gpu>_<precision>[_<variant>]_config`: bf16, fp8cs, fp8mx, fp8sc, nvfp4."""


def launcher_overrides(cfg, function_name: str) -> list[str]:
    """What Bridge's performance launcher changes in a flat recipe before it trains, done to `cfg` here too, each
    named for the output: scripts/performance/run_script.py `_run_training` (v0.6.0 to main) turns on the
    precision-aware optimizer for every bf16 recipe with Adam ("Preserve BF16 Adam precision-aware behavior from
    the previous script path"; the launcher's compute dtype is the recipe name's precision). Its other overrides
    (set_user_overrides: parallel sizes, batch, recompute, CUDA graphs, token drop) apply only to command-line
    arguments a user gives, so a recipe run as shipped keeps its own values."""
    match = RECIPE_PRECISION.search(function_name)
    precision = match.group(1) if match else ""
    done = []
    if precision == "bf16" and getattr(cfg.optimizer, "optimizer", None) == "adam" \
            and not cfg.optimizer.use_precision_aware_optimizer:
        cfg.optimizer.use_precision_aware_optimizer = True
        done.append("optimizer.use_precision_aware_optimizer=True (scripts/performance/run_script.py, bf16 Adam)")
    return done


def recipe_functions():
    """(module name, function name, function) of every performance recipe, in a stable order."""
    import megatron.bridge.perf_recipes as recipes

    for info in sorted(pkgutil.walk_packages(recipes.__path__, recipes.__name__ + "."), key=lambda i: i.name):
        parts = info.name.split(".")
        if info.ispkg or len(parts) != 6:    # megatron.bridge.perf_recipes.<family>.<gpu>.<file>
            continue
        try:
            module = importlib.import_module(info.name)
        except Exception as error:  # noqa: BLE001 - a module that does not import: each of its recipes says why
            yield info.name, None, error
            continue
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if function.__module__ == info.name and name.endswith("_config") and not name.startswith("_"):
                yield info.name, name, function


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    hub = Path(tempfile.mkdtemp(prefix="autopar-hub-"))
    offline_hub_cache(hub)
    os.environ.update(HF_HOME=str(hub), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    sys.meta_path.insert(0, _StandInFinder())
    import typing

    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override
    # Bridge retries a config.json it cannot load with a backoff of seconds (models/hf_pretrained/
    # safe_config_loader.py), meant for a flaky network; offline a missing file stays missing: no waiting
    from megatron.bridge.models.hf_pretrained import safe_config_loader

    safe_config_loader.time = types.SimpleNamespace(sleep=lambda seconds: None, time=__import__("time").time)
    index = []
    for module, name, function in recipe_functions():
        gpu_folder = module.split(".")[-2]
        entry = {"module": module, "function": name, "gpu": gpu_folder}
        if name is None:
            entry["error"] = f"module does not import: {type(function).__name__}: {function}"
            index.append(entry)
            continue
        match = RECIPE_NAME.search(name)
        entry["num_gpus"] = int(match.group(1)) if match else None
        entry["doc"] = (inspect.getdoc(function) or "").split("\n", 1)[0]   # its one-line summary, as written
        try:
            cfg = function()
            entry["launcher_overrides"] = launcher_overrides(cfg, name)
            path = out / f"{name}.yaml"
            cfg.to_yaml(str(path))
            entry["yaml"] = path.name
        except Exception as error:  # noqa: BLE001 - recorded: recipes_fit.py names it as the reason
            message = str(error).splitlines()[0] if str(error) else ""
            entry["error"] = f"{type(error).__name__}: {message}"[:300]
            if os.environ.get("AUTOPAR_RECIPES_TRACE"):
                traceback.print_exc()
        index.append(entry)
    (out / "index.json").write_text(json.dumps(index, indent=1))
    built = sum(1 for e in index if "yaml" in e)
    print(f"bridge-recipes: {built} of {len(index)} recipes built into {out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: bridge_recipes.py OUT_DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1])))
