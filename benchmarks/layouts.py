"""Layout benchmark: what per-stage pipeline layouts gain on the issue's scenarios, and what finding them costs.

    python benchmarks/layouts.py [S2 S4 S5 Q8] [--budget 60] [--cpsat-limit 30] [--no-commands]

Scenarios: S2 llama-3.1-70b on 256 H100, S4 deepseek-v3 (with its MTP layer) on 2,048 H100, S5 llama-3.1-405b on
16,384 H100, Q8 qwen3-8b (151K vocabulary) on 64 H100 with pp fixed to 8. For each: the uniform front (oracle), then
every pipelined structure on it, and every near-front structure whose gain bound says it could overtake the front,
refined with the exact layout search within --budget seconds (autopar.search.refine: chain DP without
interleaving, CP-SAT with it), and:

- the best uniform plan (the front's fastest) and the best plan once layouts are allowed, their step times and the
  predicted gain;
- the largest gain over any refined structure (its own uniform layout against its best layout, per-stage model);
- CP-SAT's own time on the winning structure (cpsat_layout, even where the DP was the engine; where the fastest plan
  has no pipeline, the structure with the largest gain), and the size of that structure's layout space
  (compositions of the layers into pp·vpp virtual stages);
- a brute-force check on a reduced instance (12 layers of the same model, the winning structure with pp <= 3 and
  vpp <= 2): the exact engine's optimum equals the brute force optimum ("yes"/"no");
- unless --no-commands, the whole `autopar solve ... --layouts` command's wall and CPU time, layouts at their
  default amount of work (target <= 10 s on S4 and S5; the machine is shared, so the CPU time is the figure to
  compare).

Ends with one line per scenario:

    layouts: SCENARIO uniform_s=X layout_s=Y gain=Z% cpsat_s=T space=10^K
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import subprocess
import sys
import time

import autopar
from autopar.search.layouts import best_layout, brute_force, cpsat_layout
from autopar.search.refine import refine_front
from costmodels.layout import with_layout
from autopar.search.solve import controls_from
from costmodels.layout import layout_space_log10, layout_tables, uniform_layout
from costmodels.specs import TrainingSpec

SCENARIOS = {
    # name: (model, gpu, gpus, seq_len, global batch, fixed knobs)
    "S2": ("llama-3.1-70b", "h100", 256, 8192, 1024, {}),
    "S4": ("deepseek-v3", "h100", 2048, 4096, 4096, {}),
    "S5": ("llama-3.1-405b", "h100", 16384, 8192, 2048, {}),
    "Q8": ("qwen3-8b", "h100", 64, 4096, 512, {"pp": 8}),
}


def command_times(name: str) -> tuple[float, float]:
    model, gpu, gpus, seq, gbs, fix = SCENARIOS[name]
    words = [model, "--gpu", gpu, "--gpus", str(gpus), "--seq-len", str(seq), "--global-batch", str(gbs),
             "--layouts"] + [f"--fix={k}={v}" for k, v in fix.items()]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "autopar.cli", "solve", *words], capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, done.stderr
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def reduced_check(model, cluster, training, plan) -> str:
    """The exact engine against brute force on 12 layers of the same model, pp <= 3, vpp <= 2."""
    small_model = dataclasses.replace(model, num_layers=12)
    if small_model.moe is not None:
        small_model = dataclasses.replace(small_model, moe=dataclasses.replace(
            small_model.moe, first_dense_layers=min(small_model.moe.first_dense_layers, 3)))
    pp, vpp = min(plan.pp, 3), min(plan.vpp, 2)
    small = dataclasses.replace(plan, pp=pp, vpp=vpp, first_stage_layers=0, last_stage_layers=0, layout=(),
                                recompute_layers=0)
    tables = layout_tables(small_model, cluster, training, small)
    truth = brute_force(tables)
    found = best_layout(tables, time_limit_s=None)
    same = (truth.best is None) == (found.best is None) and (
        truth.best is None or truth.best.objective_ns == found.best.objective_ns)
    return "yes" if same else "no"


def scenario_specs(name: str):
    """(model, cluster, training, fixed knobs) of a scenario."""
    model_name, gpu, gpus, seq, gbs, fix = SCENARIOS[name]
    return (autopar.load_model(model_name), autopar.make_cluster(gpu=gpu, num_gpus=gpus),
            TrainingSpec(seq_len=seq, global_batch_size=gbs), fix)


def scenario_fronts(name: str, budget_s: float):
    """The scenario's uniform front, the front refined with layouts, the refinements, and the uniform solve's time."""
    model, cluster, training, fix = scenario_specs(name)
    start = time.perf_counter()
    front = autopar.solve(model, cluster, training, fix=fix or None)
    solve_s = time.perf_counter() - start
    refined, refinements = refine_front(front, budget_s=budget_s, controls=controls_from(fix or None))
    return front, refined, refinements, solve_s


def layout_plans(name: str, budget_s: float) -> list:
    """The best layout of every structure the refinement searched for the scenario (its own uniform layout, written
    as a layout, where nothing beats it), as estimates of plans with that layout."""
    from costmodels.scoring import estimate

    front, refined, refinements, _ = scenario_fronts(name, budget_s)
    found = {p.plan: p for p in refined.points if p.plan.layout}
    for r in refinements:
        plan = with_layout(r.parent.plan, r.best_layout)
        found.setdefault(plan, estimate(front.model, front.cluster, front.training, plan))
    return list(found.values())


def run(name: str, budget_s: float, cpsat_limit_s: float, commands: bool) -> dict:
    model_name, gpu, gpus, seq, gbs, fix = SCENARIOS[name]
    front, refined, refinements, solve_s = scenario_fronts(name, budget_s)
    model, cluster, training = front.model, front.cluster, front.training
    uniform_best, layout_best = front.points[0], refined.points[0]
    top = max(refinements, key=lambda r: r.gain) if refinements else None
    # CP-SAT time, space and the brute-force check on the winning structure; when the fastest plan has no pipeline,
    # on the structure with the largest gain
    structure = layout_best.plan if layout_best.plan.pp > 1 else (top.parent.plan if top else uniform_best.plan)
    cpsat_s, space, check = float("nan"), 0.0, "-"
    if structure.pp > 1:
        base = dataclasses.replace(structure, layout=()) if structure.layout else structure
        if structure.layout:
            from costmodels.layout import parent_plan

            base = parent_plan(model, cluster, training, structure)
        tables = layout_tables(model, cluster, training, base)
        result = cpsat_layout(tables, time_limit_s=cpsat_limit_s, hint=uniform_layout(model, base))
        cpsat_s = result.elapsed_s if result.proven_optimal else float("inf")
        space = layout_space_log10(model.num_layers, base.pp * base.vpp)
        check = reduced_check(model, cluster, training, base)
    wall, cpu = command_times(name) if commands else (float("nan"), float("nan"))
    return dict(name=name, model=model_name, gpus=gpus, solve_s=solve_s, uniform=uniform_best, layout=layout_best,
                refined=len(refinements), improved=sum(r.best_layout != r.uniform_layout for r in refinements),
                top=top, cpsat_s=cpsat_s, space=space, check=check, wall=wall, cpu=cpu)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    parser.add_argument("--budget", type=float, default=60.0, help="refinement budget per scenario, seconds")
    parser.add_argument("--cpsat-limit", type=float, default=30.0, help="CP-SAT limit on the winning structure")
    parser.add_argument("--no-commands", action="store_true", help="skip timing the whole solve --layouts command")
    args = parser.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    rows = [run(name, args.budget, args.cpsat_limit, not args.no_commands) for name in args.scenarios]
    table = Table(title="per-stage pipeline layouts (shared 2-core machine; predicted by the cost model)")
    for column in ("scenario", "best uniform plan", "uniform s", "best plan with layouts", "layout s", "gain",
                   "structures refined / improved", "largest structure gain", "CP-SAT s", "space",
                   "brute force (reduced)", "solve --layouts wall / cpu s"):
        table.add_column(column, justify="left" if "plan" in column or column == "scenario" else "right")
    for r in rows:
        gain = 1.0 - r["layout"].step_time_s / r["uniform"].step_time_s
        top = r["top"]
        table.add_row(f"{r['name']} {r['model']} {r['gpus']}", r["uniform"].plan.short(),
                      f"{r['uniform'].step_time_s:.3f}", r["layout"].plan.short(), f"{r['layout'].step_time_s:.3f}",
                      f"{100 * gain:.2f}%", f"{r['refined']} / {r['improved']}",
                      f"{100 * top.gain:.1f}% ({top.parent.plan.short()})" if top else "-",
                      f"{r['cpsat_s']:.2f}", f"10^{r['space']:.0f}", r["check"],
                      f"{r['wall']:.1f} / {r['cpu']:.1f}")
    console.print(table)
    for r in rows:
        gain = 1.0 - r["layout"].step_time_s / r["uniform"].step_time_s
        print(f"layouts: {r['name']} uniform_s={r['uniform'].step_time_s:.3f} layout_s={r['layout'].step_time_s:.3f} "
              f"gain={100 * gain:.2f}% cpsat_s={r['cpsat_s']:.2f} space=10^{r['space']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
