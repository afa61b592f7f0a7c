"""Fit the profile to half of each published source's runs and predict the other half (`calibrate --from-runs`).

For every source of shared/reference/runs/ with at least MIN_ROWS comparable rows on one GPU type (the rows
benchmarks/fidelity_runs.py turns into autopar inputs, each priced at the layout it states), the rows are split
by a fixed rule: in the order fidelity_runs reads them (file order), the 1st, 3rd, 5th, ... row is fitted, the
2nd, 4th, ... held back. The bundled profile of that GPU is fitted to the first half
(autopar.calibrate.from_runs.fit_profile_to_runs, exactly what `autopar calibrate --from-runs` runs), and both
the bundled and the fitted profile predict the held-back half, each at the fastest layout that agrees with what
the row states and fits (autopar.runs.choose_plan). Printed per source: rows fitted / held back, the MAPE of the
bundled and of the fitted profile on the held-back half, the fitted profile's MAPE on the half it was fitted to
and its leave-one-out MAPE, the fit's time, whether the fit passed its validation rule (adopted: its leave-one-out
error below the bundled profile's on its half; a fit not adopted is the bundled profile), and whether the source
reaches the target (fitted <= 5% and not worse than bundled on the held-back half). Where it does not, one line says
why, from what the rows and the fits show:
- the fit was not adopted (its two errors);
- rows the cost model cannot tell apart (same inputs, same layout) measured further apart than any one prediction
  can be within 5% of both (max/min > 1.05/0.95): what distinguishes them is not an autopar input;
- the free parameters fitted to all the source's rows (in-sample, no validation: the best any scales reach) stay
  above 5%, with the most negative and most positive mean error among the layouts of >= 2 rows: model errors that
  change with the layout, which no one scale per kernel or link absorbs;
- otherwise the fit does not carry over from one half to the other.

Then the time of one fit to 100 runs (the first 100 comparable rows of the GPU type with the most rows): wall and
CPU seconds (this process and its workers), the model evaluations and the vectorised model calls they took, the
machine's load average and CPU count (on a shared machine the wall time follows the load; the CPU time does not).

    python benchmarks/fit_runs.py [--jobs N] [--verbose]

Ends with `fit-runs: sources=N bundled_mape=X% fitted_mape=Y% worst_source=S` (MAPEs over every held-back row).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as `python benchmarks/NAME.py`: the checkout's root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # makes `benchmarks.*` importable

from autopar.calibrate.from_runs import default_jobs, fit_profile_to_runs, same_run_groups  # noqa: E402
from autopar.calibrate.runs_profile import bundled_profile_data  # noqa: E402
from autopar.runs import choose_plan  # noqa: E402
from benchmarks import fidelity_runs  # noqa: E402

MIN_ROWS = 10
TARGET_MAPE = 0.05
TIMING_RUNS = 100


def comparable_rows() -> dict[tuple[str, str], list]:
    """(source, profile name) -> the source's expressible rows on that GPU, in file order."""
    groups: dict[tuple[str, str], list] = {}
    for row in fidelity_runs.all_rows():
        if isinstance(row, fidelity_runs.Case):
            groups.setdefault((row.source, row.cluster.profile.name), []).append(row)
    return groups


def split(rows: list) -> tuple[list, list]:
    """The fixed split: alternate rows in file order, the first fitted."""
    return rows[0::2], rows[1::2]


def predictions(rows: list, profile) -> list:
    """Each row's PlanChoice on `profile`: the fastest fitting layout it allows, and its step time."""
    return [choose_plan(row, dataclasses.replace(row.cluster, profile=profile)) for row in rows]


def errors(rows: list, choices: list) -> list[float]:
    return [choice.step_s / row.measured_step_s - 1.0 for row, choice in zip(rows, choices)]


def mape(errors: list[float]) -> float:
    return statistics.fmean(abs(e) for e in errors) if errors else float("nan")


def replicate_spread(rows: list, plans: list) -> "tuple[int, int, float]":
    """(rows, runs, largest max/min − 1) of the groups of rows the cost model prices identically (same inputs, same
    layout: autopar.calibrate.from_runs.same_run_groups) whose measurements are further apart than any one
    prediction can be within TARGET_MAPE of both: max/min > (1 + T)/(1 − T)."""
    apart = [[rows[i].measured_step_s for i in group] for group in same_run_groups(rows, plans) if len(group) > 1]
    apart = [times for times in apart if max(times) / min(times) > (1 + TARGET_MAPE) / (1 - TARGET_MAPE)]
    if not apart:
        return 0, 0, 0.0
    return sum(map(len, apart)), len(apart), max(max(times) / min(times) - 1.0 for times in apart)


def layout_residuals(fit) -> "tuple[tuple[float, str, int], tuple[float, str, int]] | None":
    """The most negative and most positive mean fitted error of the rows sharing a layout (groups of >= 2 rows), as
    (mean error, layout, rows); None with fewer than two such layouts."""
    by_layout: dict[str, list[float]] = {}
    for r in fit.residuals:
        by_layout.setdefault(r.plan.short(), []).append(r.error(r.fitted_s))
    means = sorted((statistics.fmean(e), layout, len(e)) for layout, e in by_layout.items() if len(e) >= 2)
    return (means[0], means[-1]) if len(means) >= 2 else None


def why_not(rows: list, fit, fitted: float, bundled: float, jobs: int) -> str:
    """One line: why a source misses the target, from what the fit and the rows themselves show."""
    reasons = []
    if not fit.adopted:
        loo, prior = fit.leave_one_out_check
        reasons.append(f"the fit was not adopted (leave-one-out RMS {loo:.1%} >= bundled {prior:.1%} on its half: "
                       "bundled kept)")
    plans = [choice.plan for choice in predictions(rows, rows[0].cluster.profile)]
    spread_rows, spread_runs, spread = replicate_spread(rows, plans)
    if spread_rows:
        runs = "1 run" if spread_runs == 1 else f"{spread_runs} runs"
        reasons.append(f"{spread_rows} rows are {runs} to autopar (same inputs and layout) measured up to {spread:.0%} "
                       "apart: what tells them apart is not an autopar input")
    if fitted > TARGET_MAPE:
        base = rows[0].cluster.profile
        whole = fit_profile_to_runs(rows, base, bundled_profile_data(base.name), jobs=jobs, validate=False)
        floor = whole.mape("fitted_s")
        if floor > TARGET_MAPE:
            text = f"fitted to all {len(rows)} rows (in-sample) the free parameters reach only {floor:.1%}"
            spread_by_layout = layout_residuals(whole)
            if spread_by_layout is not None:
                (low, low_layout, low_rows), (high, high_layout, high_rows) = spread_by_layout
                text += (f", errors by layout from {low:+.0%} ({low_layout}, {low_rows} rows) to {high:+.0%} "
                         f"({high_layout}, {high_rows} rows): model errors that change with the layout, which no "
                         "profile scale absorbs")
            reasons.append(text)
        else:
            reasons.append(f"the fit does not carry over: all {len(rows)} rows can be fitted to {floor:.1%}, but "
                           f"half of them predict the other half to {fitted:.1%}")
    if fitted > bundled and fit.adopted:
        reasons.append(f"worse than bundled ({fitted:.1%} > {bundled:.1%}) although the fit improved its own "
                       "leave-one-out error")
    return "; ".join(reasons)


def run(jobs: int, verbose: bool = False) -> dict:
    groups = comparable_rows()
    print(f"{'source':<22} {'gpu':<12} {'fit':>4} {'held':>5} {'bundled %':>10} {'fitted %':>9} {'fit-half %':>10} "
          f"{'LOO %':>7} {'fit s':>6} {'adopted':>8} {'target':>7}  why not")
    all_bundled, all_fitted, per_source = [], [], {}
    for (source, gpu), rows in sorted(groups.items()):
        if len(rows) < MIN_ROWS:
            continue
        fit_rows, held = split(rows)
        base = rows[0].cluster.profile
        fit = fit_profile_to_runs(fit_rows, base, bundled_profile_data(base.name), jobs=jobs)
        bundled_errors = errors(held, predictions(held, base))
        fitted_errors = errors(held, predictions(held, fit.profile)) if fit.adopted else bundled_errors
        bundled, fitted = mape(bundled_errors), mape(fitted_errors)
        fit_half, loo = fit.mape("fitted_s"), fit.mape("leave_one_out_s")
        reached = fitted <= TARGET_MAPE and fitted <= bundled
        why = "" if reached else why_not(rows, fit, fitted, bundled, jobs)
        print(f"{source:<22} {gpu:<12} {len(fit_rows):>4} {len(held):>5} {100 * bundled:>10.1f} {100 * fitted:>9.1f} "
              f"{100 * fit_half:>10.1f} {100 * loo:>7.1f} {fit.elapsed_s:>6.1f} {'yes' if fit.adopted else 'no':>8} "
              f"{'yes' if reached else 'NO':>7}  {why}")
        if verbose:
            for q in fit.parameters:
                print(f"    {q.parameter.name:<30} x{q.scale:.4g}  {q.status}")
            for warning in fit.warnings:
                print(f"    warning: {warning}")
        all_bundled += bundled_errors
        all_fitted += fitted_errors
        per_source[f"{source}/{gpu}"] = (bundled, fitted, reached, fit)
    print()
    timing = timing_run(groups, jobs)
    worst = max(per_source, key=lambda key: per_source[key][1]) if per_source else "none"
    print(f"fit-runs: sources={len(per_source)} bundled_mape={100 * mape(all_bundled):.1f}% "
          f"fitted_mape={100 * mape(all_fitted):.1f}% worst_source={worst}")
    return dict(per_source=per_source, bundled_mape=mape(all_bundled), fitted_mape=mape(all_fitted), worst=worst,
                timing=timing)


def cpu_seconds() -> float:
    """CPU seconds of this process and of its finished children (the fit's worker processes)."""
    import resource

    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def timing_run(groups: dict, jobs: int) -> "tuple[int, float]":
    """One fit to TIMING_RUNS runs of one GPU type (the type with the most comparable rows), timed: wall seconds and
    the CPU seconds of the fit and its workers (a shared machine's load shows in the first, not the second)."""
    by_gpu: dict[str, list] = {}
    for (_, gpu), rows in sorted(groups.items()):
        by_gpu.setdefault(gpu, []).extend(rows)
    gpu = max(by_gpu, key=lambda name: len(by_gpu[name]))
    runs = by_gpu[gpu][:TIMING_RUNS]
    base = runs[0].cluster.profile
    data = bundled_profile_data(base.name)
    started, cpu = time.perf_counter(), cpu_seconds()
    fit = fit_profile_to_runs(runs, base, data, jobs=jobs)
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    print(f"fit-runs-timing: runs={len(runs)} gpu={gpu} seconds={seconds:.1f} cpu_seconds={cpu:.1f} "
          f"model_evaluations={fit.model_evaluations} model_calls={fit.model_calls} "
          f"cpu_ms_per_evaluation={1000 * cpu / fit.model_evaluations:.1f} jobs={jobs} "
          f"load_average={os.getloadavg()[0]:.1f} cpus={os.cpu_count()}")
    return len(runs), seconds


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="processes for the model evaluations")
    parser.add_argument("--verbose", action="store_true", help="print each fit's parameters and warnings")
    args = parser.parse_args(argv)
    run(max(1, args.jobs), verbose=args.verbose)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
