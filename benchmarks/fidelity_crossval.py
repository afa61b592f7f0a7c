"""Leave-one-source-out cross-validation of the values fitted outside the microbenchmark path.

- elementwise.traffic_per_activation_byte (A100 profile): the one value still fitted to end-to-end runs, on two
  sources (Narayanan et al. 2021 Table 1 and Korthikanti et al. 2022 Table 5; benchmarks/fit_profiles.py
  --elementwise-only). Each fold refits it on one source alone and predicts the other source's rows.
- costmodels.overheads.KERNEL_LAUNCH_S: fitted from one source (the dgxc cpu_overhead sample); with a single source
  no source can be left out, so the fold leaves out one measured size at a time instead and reports the spread.
- The microbenchmark fits (collectives, GEMMs) have their own leave-one-file-out check:
  `python benchmarks/fidelity_microbench.py --cross-validate`.

    python benchmarks/fidelity_crossval.py

Ends with `fidelity-crossval: elementwise_loso_mean=X% elementwise_loso_max=Y% launch_loo_max=Z%`.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

import numpy as np

if __name__ == "__main__" and not __package__:  # run as `python benchmarks/NAME.py`: the checkout's root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # makes `benchmarks.*` importable

from benchmarks import fit_profiles  # noqa: E402
from benchmarks.reference import reference_dir  # noqa: E402
from costmodels import overheads  # noqa: E402
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


def launch_folds() -> tuple[float, list[float]]:
    """(fitted value s, leave-one-size-out errors % of predicting the held-out size by the others' median)."""
    path = reference_dir() / "microbench" / overheads.LAUNCH_SOURCE
    with open(path, newline="", encoding="utf-8") as handle:
        values = [float(r["avg_time_per_op_us"]) for r in csv.DictReader(
            line for line in handle if not line.startswith("#"))]
    errors = []
    for i, held in enumerate(values):
        rest = values[:i] + values[i + 1:]
        errors.append(100.0 * (statistics.median(rest) - held) / held)
    return statistics.median(values) * 1e-6, errors


def main() -> int:
    print("leave one source out: elementwise.traffic_per_activation_byte (a100-80gb), refit on the other source")
    print(f"{'held-out source':<26} {'fitted':>8} {'rows':>5} {'mean |err| %':>13} {'max |err| %':>12}")
    all_errors = []
    for held, value, errors in elementwise_folds():
        all_errors += [abs(e) for e in errors]
        print(f"{held:<26} {value:>8.3f} {len(errors):>5} {statistics.fmean(abs(e) for e in errors):>13.2f} "
              f"{max(abs(e) for e in errors):>12.2f}")
    value, launch_errors = launch_folds()
    print(f"\nkernel launch: {value * 1e6:.2f} us from one source ({overheads.LAUNCH_SOURCE}); no other source to "
          f"leave out. Leave one size out: max |err| {max(abs(e) for e in launch_errors):.1f}% "
          f"(sizes spread {min(launch_errors):+.1f}..{max(launch_errors):+.1f}%)")
    print(f"fidelity-crossval: elementwise_loso_mean={statistics.fmean(all_errors):.2f}% "
          f"elementwise_loso_max={max(all_errors):.2f}% launch_loo_max={max(abs(e) for e in launch_errors):.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
