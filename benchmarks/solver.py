"""Solver benchmark: the exhaustive oracle and the CP-SAT model on the issue's five scenarios.

    python benchmarks/solver.py [--oracle-budget 120] [--cpsat-budget 30] [--cpsat-max-rows 5000000] [S1 S3 ...]
    python benchmarks/solver.py --commands [NAME ...] [--repeats 3] [--jobs N]

--commands times whole `autopar solve` commands instead (COMMANDS: dense S1, S2, S5; the MoE scenarios mixtral-8x7b
on 256, qwen3-235b-a22b on 2,048 and deepseek-v3 on 2,048 H100; the llama-3.1-70b --gpus 64-4096 scaling front; the
deepest model autopar accepts, Llama-3.1-8B's shape at costmodels.limits.MAX_NUM_LAYERS layers on 128 GPUs),
each run --repeats times: best and median wall time, CPU time (the machine is shared: wall includes waiting for a
core), the target, and a digest of the front (plans, step times, peaks) so fronts can be compared across commits.
--jobs N passes `--jobs N` to every command (the search's processes; default: the command's own, the machine's
CPUs), so one process and several can be timed in the same window. Ends with one line per command:

    command: NAME wall_best_s=X wall_median_s=Y cpu_best_s=Z target_s=T front=DIGEST jobs=N|auto

S1-S5 are the issue's scenarios (all knobs free). S0 is an illustration only: S1's model on 8 GPUs with zero, sp
and cp pinned and mbs <= 2, vpp <= 2, pp <= 4, a space of ~2k plans on which the CP-SAT walk finishes.

For each scenario: the size of the search space, the oracle's time (when its budget runs out, the time measured so
far and an extrapolation from the share of structures it covered), CP-SAT's time (model build + front walk, under
its own budget; skipped when its tables would exceed --cpsat-max-rows), the front size, and whether the two fronts
are equal (same integer objective vectors and plans; "untested" when one of them did not finish). It also times
the whole `autopar solve llama-3.1-8b --gpus 32` command (start-up included). Ends with one line per scenario:

    solver: SCENARIO cpsat_s=X oracle_s=Y front=N equal=yes|no|untested

With the default CP-SAT budget (30 s) only S0 finishes; `python benchmarks/solver.py S1 --cpsat-budget 600` shows
the table model reaching S1's front whole (measured: 392 s for the oracle's 46 points, equal=yes; oracle 0.15 s).
benchmarks/cpsat_decomposed.py asks whether smaller tables would change that (they do not).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass

import autopar
from costmodels.rules import Problem, active_rules
from autopar.search.space import Controls, build_space
from costmodels.specs import TrainingSpec

SCENARIOS = {
    "S0": ("llama-3.1-8b", "h100", 8, 4096, 32),       # illustration: pinned to a tiny space CP-SAT can finish
    "S1": ("llama-3.1-8b", "h100", 32, 8192, 256),
    "S2": ("llama-3.1-70b", "h100", 256, 8192, 1024),
    "S3": ("gpt-530b", "a100-80gb", 2520, 2048, 2520),
    "S4": ("deepseek-v3", "h100", 2048, 4096, 4096),
    "S5": ("llama-3.1-405b", "h100", 16384, 8192, 2048),
}

S0_CONTROLS = Controls(fix={"zero": 1, "sp": 1, "cp": 1}, maximum={"mbs": 2, "vpp": 2, "pp": 4})


@dataclass
class Row:
    name: str
    space: int
    oracle_s: str
    oracle_front: int
    cpsat_s: str
    cpsat_front: str
    equal: str
    note: str


def estimated_table_rows(space, ctx) -> int:
    from autopar.search import objective
    from autopar.search.tables import largest_table_candidates

    return largest_table_candidates(objective.objective_structure(ctx.model, ctx.cluster, ctx.training), space)


def run_scenario(name: str, oracle_budget: float, cpsat_budget: float, cpsat_max_rows: int) -> Row:
    from autopar.search.oracle import solve_oracle

    model_name, gpu, gpus, seq, gbs = SCENARIOS[name]
    model = autopar.load_model(model_name)
    cluster = autopar.make_cluster(gpu=gpu, num_gpus=gpus)
    training = TrainingSpec(seq_len=seq, global_batch_size=gbs)
    controls = S0_CONTROLS if name == "S0" else Controls()
    space = build_space(model, cluster, training, controls)
    rules = active_rules()
    ctx = Problem(model, cluster, training)

    start = time.perf_counter()
    oracle = solve_oracle(space, ctx, rules, time_budget_s=oracle_budget)
    oracle_s = time.perf_counter() - start
    if oracle.complete:
        oracle_text = f"{oracle_s:.2f}"
    else:
        oracle_text = f">{oracle_s:.0f}"

    rows = estimated_table_rows(space, ctx)
    note = f"largest CP-SAT table <= {rows:,} candidate rows"
    if rows > cpsat_max_rows:
        return Row(name, space.size, oracle_text, len(oracle.time_units), "skipped", "-", "untested",
                   note + f" (> {cpsat_max_rows:,}: not built)")
    from autopar.search.cpsat import build_pareto_model, walk_front

    start = time.perf_counter()
    pm = build_pareto_model(space, ctx, rules)
    build_s = time.perf_counter() - start
    remaining = max(1.0, cpsat_budget - build_s)
    result = walk_front(pm, time_limit_s=remaining)
    cpsat_s = time.perf_counter() - start
    note += f"; built {pm.table_rows:,} rows in {build_s:.1f} s, {result.solves} solves"
    if not result.proven_optimal:
        return Row(name, space.size, oracle_text, len(oracle.time_units), f">{cpsat_s:.0f}",
                   f"{len(result.time_units)} (partial)", "untested", note)
    same = (oracle.complete and list(result.time_units) == list(oracle.time_units)
            and list(result.memory_units) == list(oracle.memory_units)
            and list(result.plans) == list(oracle.plans))
    return Row(name, space.size, oracle_text, len(oracle.time_units), f"{cpsat_s:.2f}", str(len(result.time_units)),
               ("yes" if same else "no") if oracle.complete else "untested", note)


def whole_command_s() -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "autopar.cli", "solve", "llama-3.1-8b", "--gpus", "32",
                           "--seq-len", "8192", "--global-batch", "256"], capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    return elapsed


DEEPEST_MODEL = "DEEPEST"
"""Stands for a config.json of Llama-3.1-8B's shape with costmodels.limits.MAX_NUM_LAYERS layers (written to a
temporary folder): the deepest model autopar accepts, whose solve the layer limit is set by."""


def deepest_config(folder: str) -> str:
    """The DEEPEST_MODEL config.json in `folder`; returns its path."""
    import json
    import os

    from costmodels.limits import MAX_NUM_LAYERS

    preset = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "autopar", "presets", "llama-3.1-8b.json")
    with open(preset, encoding="utf-8") as handle:
        config = json.load(handle)
    path = os.path.join(folder, "config.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(dict(config, num_hidden_layers=MAX_NUM_LAYERS), handle)
    return path


COMMANDS = {
    # name: (arguments of `autopar solve`, target seconds for the whole command on 2 cores; None = no target)
    "S1": (["llama-3.1-8b", "--gpus", "32", "--seq-len", "8192", "--global-batch", "256"], None),
    "S2": (["llama-3.1-70b", "--gpus", "256", "--seq-len", "8192", "--global-batch", "1024"], None),
    "S5": (["llama-3.1-405b", "--gpus", "16384", "--seq-len", "8192", "--global-batch", "2048"], None),
    "MoE-mixtral": (["mixtral-8x7b", "--gpus", "256"], 3.0),
    "MoE-qwen3": (["qwen3-235b-a22b", "--gpus", "2048"], 3.0),
    "MoE-S4": (["deepseek-v3", "--gpus", "2048", "--seq-len", "4096", "--global-batch", "4096"], 3.0),
    "scaling": (["llama-3.1-70b", "--gpus", "64-4096"], 10.0),
    "deepest": ([DEEPEST_MODEL, "--gpus", "128"], 10.0),
}
"""The whole `autopar solve` commands timed by --commands (start-up, search, re-scoring and output included)."""


@dataclass
class CommandTiming:
    name: str
    wall_s: list[float]
    cpu_s: list[float]
    front_digest: str
    target_s: float | None
    jobs: int | None = None


def time_command(name: str, repeats: int, jobs: int | None = None) -> CommandTiming:
    """Run the command `repeats` times; wall time and the CPU time of the child (user + system): on a shared
    machine the wall time includes waiting for a core, the CPU time does not."""
    import hashlib
    import json
    import resource

    import tempfile

    arguments, target = COMMANDS[name]
    walls, cpus, digest = [], [], ""
    folder = tempfile.mkdtemp(prefix="autopar-bench-")
    arguments = [deepest_config(folder) if argument == DEEPEST_MODEL else argument for argument in arguments]
    arguments += [] if jobs is None else ["--jobs", str(jobs)]
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "autopar.cli", "solve", *arguments, "--json"],
                              capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        assert done.returncode == 0, done.stderr
        points = json.loads(done.stdout)["points"]
        key = json.dumps([[p["plan"], p.get("step_time_s"), p.get("peak_memory_bytes")] for p in points],
                         sort_keys=True)
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return CommandTiming(name, walls, cpus, digest, target, jobs)


def print_command_timings(console, timings: list[CommandTiming]) -> None:
    import statistics

    from rich.table import Table

    table = Table(title="whole `autopar solve` commands (shared 2-core machine: best and median of the runs)")
    for column in ("command", "runs", "wall best s", "wall median s", "cpu best s", "cpu median s", "target s",
                   "front digest"):
        table.add_column(column, justify="left" if column in ("command", "front digest") else "right")
    for t in timings:
        table.add_row(t.name + ": autopar solve " + " ".join(COMMANDS[t.name][0]), str(len(t.wall_s)),
                      f"{min(t.wall_s):.2f}", f"{statistics.median(t.wall_s):.2f}", f"{min(t.cpu_s):.2f}",
                      f"{statistics.median(t.cpu_s):.2f}", "-" if t.target_s is None else f"{t.target_s:g}",
                      t.front_digest)
    console.print(table)
    for t in timings:
        target = "-" if t.target_s is None else f"{t.target_s:g}"
        print(f"command: {t.name} wall_best_s={min(t.wall_s):.2f} wall_median_s={statistics.median(t.wall_s):.2f} "
              f"cpu_best_s={min(t.cpu_s):.2f} target_s={target} front={t.front_digest} "
              f"jobs={'auto' if t.jobs is None else t.jobs}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    parser.add_argument("--cpsat-s0-budget", type=float, default=120.0, help="CP-SAT budget for S0")
    parser.add_argument("--oracle-budget", type=float, default=120.0)
    parser.add_argument("--cpsat-budget", type=float, default=30.0)
    parser.add_argument("--cpsat-max-rows", type=int, default=5_000_000)
    parser.add_argument("--commands", nargs="*", metavar="NAME",
                        help=f"time only these whole commands ({', '.join(COMMANDS)}; none given: all) and exit")
    parser.add_argument("--repeats", type=int, default=3, help="runs per whole command (--commands)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="--jobs N for every command (--commands; default: the command's own)")
    args = parser.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    if args.commands is not None:
        names = args.commands or list(COMMANDS)
        unknown = [n for n in names if n not in COMMANDS]
        if unknown:
            parser.error(f"unknown command {unknown[0]!r}; use {', '.join(COMMANDS)}")
        print_command_timings(console, [time_command(n, args.repeats, args.jobs) for n in names])
        return 0
    command_s = whole_command_s()
    console.print(f"`autopar solve llama-3.1-8b --gpus 32` (whole command, default solver): {command_s:.2f} s wall")
    results = []
    for name in args.scenarios:
        budget = args.cpsat_s0_budget if name == "S0" else args.cpsat_budget
        row = run_scenario(name, args.oracle_budget, budget, args.cpsat_max_rows)
        results.append(row)
        console.print(f"{name} done", style="dim")
    table = Table(title="solver benchmark (oracle = exhaustive numpy enumeration; CP-SAT = table model, 1 worker)")
    for column in ("scenario", "space", "oracle s", "oracle front", "CP-SAT s", "CP-SAT front", "equal", "note"):
        table.add_column(column, justify="left" if column in ("scenario", "note") else "right")
    for r in results:
        table.add_row(r.name, f"{r.space:,}", r.oracle_s, str(r.oracle_front), r.cpsat_s, r.cpsat_front, r.equal,
                      r.note)
    console.print(table)
    for r in results:
        print(f"solver: {r.name} cpsat_s={r.cpsat_s} oracle_s={r.oracle_s} front={r.oracle_front} equal={r.equal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
