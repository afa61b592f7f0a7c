"""Start-up benchmark: how long whole `autopar` commands take, start-up included, and what they import.

    python benchmarks/startup.py [--runs 5]

Each command runs `--runs` times as a fresh process (`python -m autopar.cli ...`, stdout discarded); the table shows
the median and the best wall time, the median CPU time (user + system: what the process itself cost, less
sensitive to other load on a shared machine than wall time), the peak resident memory of the process (wait4's ru_maxrss) and whether
transformers was imported (checked by a separate run under `python -X importtime`). The commands:

- `autopar --help`
- `autopar solve CONFIG --gpus 64` on a local copy of Llama 3.1 8B's config.json (the HF file, as users have it);
  the target (issue 12) is <= 1.5 s for the whole command on a 2-core machine
- the same solve on the bundled preset `llama-3.1-8b`, for comparison
- `autopar estimate CONFIG --gpus 64 --tp 8` (no search: loading and one estimate)

Ends with one line:

    startup: config_solve_s=X config_solve_cpu_s=C preset_solve_s=Y help_s=Z estimate_s=W target_s=1.5 within_target=yes|no
             transformers_imported=no

Times depend on the machine and its load; quote them with the machine's state (the project's machines are shared).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 1.5


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float, int, float]:
    """(wall seconds, peak RSS MiB, exit code, CPU seconds user + system) of one fresh process."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "autopar.cli", *argv], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024, process.returncode, usage.ru_utime + usage.ru_stime


def imports_transformers(argv: list[str], env: dict[str, str]) -> bool:
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "autopar.cli", *argv], capture_output=True,
                            text=True, env=env, cwd=ROOT)
    return any(line.split("|")[-1].strip() == "transformers" for line in result.stderr.splitlines())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per command (median and best reported)")
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    folder = Path(tempfile.mkdtemp(prefix="autopar-startup-"))
    try:
        config = folder / "Llama-3.1-8B" / "config.json"
        config.parent.mkdir()
        shutil.copy(ROOT / "autopar" / "presets" / "llama-3.1-8b.json", config)
        commands = {
            "help": ["--help"],
            "config_solve": ["solve", str(config), "--gpus", "64"],
            "preset_solve": ["solve", "llama-3.1-8b", "--gpus", "64"],
            "estimate": ["estimate", str(config), "--gpus", "64", "--tp", "8"],
        }
        table = Table(title=f"whole commands, {args.runs} fresh processes each (cpu count {os.cpu_count()}, "
                            f"load {os.getloadavg()[0]:.1f})", title_justify="left")
        for name in ("command", "median s", "best s", "median CPU s", "peak RSS MiB", "exit", "imports transformers"):
            table.add_column(name, justify="left" if name == "command" else "right")
        medians: dict[str, float] = {}
        cpu: dict[str, float] = {}
        imported: dict[str, bool] = {}
        for name, argv in commands.items():
            runs = [run_once(argv, env) for _ in range(args.runs)]
            medians[name] = statistics.median(r[0] for r in runs)
            cpu[name] = statistics.median(r[3] for r in runs)
            imported[name] = imports_transformers(argv, env)
            shown = " ".join(["autopar", *argv]).replace(str(config), "./config.json")
            table.add_row(shown, f"{medians[name]:.2f}", f"{min(r[0] for r in runs):.2f}", f"{cpu[name]:.2f}",
                          f"{max(r[1] for r in runs):.0f}", ",".join(sorted({str(r[2]) for r in runs})),
                          "yes" if imported[name] else "no")
        Console(width=140).print(table)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    within = medians["config_solve"] <= TARGET_S
    print(f"startup: config_solve_s={medians['config_solve']:.2f} config_solve_cpu_s={cpu['config_solve']:.2f} "
          f"preset_solve_s={medians['preset_solve']:.2f} "
          f"help_s={medians['help']:.2f} estimate_s={medians['estimate']:.2f} target_s={TARGET_S} "
          f"within_target={'yes' if within else 'no'} "
          f"transformers_imported={'yes' if any(imported.values()) else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
