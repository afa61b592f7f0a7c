"""Leave-one-source-out cross-validation of the values fitted outside the microbenchmark path.

- elementwise.traffic_per_activation_byte (A100 profile): the one value still fitted to end-to-end runs, on two
  sources (Narayanan et al. 2021 Table 1 and Korthikanti et al. 2022 Table 5; benchmarks/fit_profiles.py
  --elementwise-only). Each fold refits it on one source alone and predicts the other source's rows.
- the profiles' `host:` launch costs (costmodels.host), fitted to the host-dispatch microbenchmarks: each row of a
  launch path measured more than once is left out, the rest refitted, and the row predicted.
- The microbenchmark fits (collectives, GEMMs) have their own leave-one-file-out check:
  `python benchmarks/fidelity_microbench.py --cross-validate`.

    python benchmarks/fidelity_crossval.py

Ends with `fidelity-crossval: elementwise_loso_mean=X% elementwise_loso_max=Y% host_loo_max=Z%`.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

if __name__ == "__main__" and not __package__:  # run as `python benchmarks/NAME.py`: the checkout's root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # makes `benchmarks.*` importable

from benchmarks import fit_profiles  # noqa: E402
from costmodels.hardware import load_profile  # noqa: E402

ELEMENTWISE = ("traffic_per_activation_byte",)


def elementwise_folds() -> list[tuple[str, float, list[float]]]:
    """(held-out source, value fitted without it, held-out errors %) per source."""
    profile = load_profile("a100-80gb")
    start = fit_profiles.current_parameters(profile)
    rows = fit_profiles.fit_rows(profile)
    sources = np.array([r.source for r in rows])
    folds = []
    for held in dict.fromkeys(sources):
        keep = sources != held
        fitted = fit_profiles.levenberg_marquardt(profile, start, keep=keep, free=ELEMENTWISE, iterations=30)
        errors = 100.0 * (np.exp(fit_profiles.residuals(profile, fitted)[~keep]) - 1.0)
        folds.append((str(held), fitted[ELEMENTWISE[0]], [float(e) for e in errors]))
    return folds


def host_folds() -> list[tuple[str, float, float]]:
    """(launch path, the row held out, the error % of predicting it from the fit to the others) for every host row
    of a path measured more than once (costmodels.host's `host:` section, autopar.calibrate.fit.fit_host_costs)."""
    from autopar.calibrate.fit import fit_host_costs, predict_host_row_us
    from benchmarks import microbench_tables as tables
    from costmodels.hardware import load_profile

    rows = [row.measurement for file in ("host_dispatch_launch_overhead_issue_threads.csv",
                                         "launch_overhead_small_gemm_dgxc_sample.csv")
            for row in tables.all_rows()[file] if "h100-80gb" in row.profiles]   # x86 hosts (Grace's are scaled)
    base = load_profile("h100-80gb")
    out = []
    for i, held in enumerate(rows):
        if sum(1 for row in rows if row.path == held.path) < 2:
            continue
        fit = fit_host_costs(rows[:i] + rows[i + 1:], base)
        values = {key: getattr(base.host_costs, key[:-3] + "_s") * 1e6 for key in fit.params} | fit.params
        values = {**{key: getattr(base.host_costs, key[:-3] + "_s") * 1e6
                     for key in ("aten_op_us", "aten_gemm_us", "triton_launch_us", "compiled_call_us",
                                 "cuda_graph_replay_us", "cuda_graph_node_us", "launch_us", "sync_us")}, **values}
        measured = held.timing.median_s * 1e6
        out.append((held.path, measured, 100.0 * (predict_host_row_us(held, values) - measured) / measured))
    return out


def main() -> int:
    print("leave one source out: elementwise.traffic_per_activation_byte (a100-80gb), refit on the other source")
    print(f"{'held-out source':<26} {'fitted':>8} {'rows':>5} {'mean |err| %':>13} {'max |err| %':>12}")
    all_errors = []
    for held, value, errors in elementwise_folds():
        all_errors += [abs(e) for e in errors]
        print(f"{held:<26} {value:>8.3f} {len(errors):>5} {statistics.fmean(abs(e) for e in errors):>13.2f} "
              f"{max(abs(e) for e in errors):>12.2f}")
    folds = host_folds()
    print("\nhost launch costs (the profiles' host: section): leave one row out, refit, predict it")
    print(f"{'launch path':<20} {'rows':>5} {'max |err| %':>12}")
    for path in dict.fromkeys(p for p, _, _ in folds):
        errors = [abs(e) for p, _, e in folds if p == path]
        print(f"{path:<20} {len(errors):>5} {max(errors):>12.1f}")
    host_max = max(abs(e) for _, _, e in folds)
    print(f"fidelity-crossval: elementwise_loso_mean={statistics.fmean(all_errors):.2f}% "
          f"elementwise_loso_max={max(all_errors):.2f}% host_loo_max={host_max:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
