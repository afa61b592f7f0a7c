"""How well the bundled profiles reproduce the public microbenchmarks they were fitted to, file by file.

For every table of shared/reference/microbench/ that benchmarks/microbench_tables.py reads: the cost model's
prediction of each row (`autopar.calibrate.fit.predict_collective_s` for collectives, `costmodels.compute`'s GEMM
efficiency × peak for GEMMs) with the bundled profile of that GPU, the median and max |predicted / measured − 1|
over the rows the file feeds to the fit, the same over its check-only rows (not fitted: other fabric, non-default
NCCL setting, launch-bound or misaligned GEMMs), and the profile keys the file feeds. Ends with
`fidelity-microbench: files=N median=X% max=Y%` over the fitted rows.

--cross-validate: leave one source file out — refit every profile without it (benchmarks/fit_microbench.py, the same
path as `autopar profile fit`), predict its fitted rows, and print the held-out errors; ends with
`fidelity-microbench-loso: files=N median=X% max=Y%`.

    python benchmarks/fidelity_microbench.py [--cross-validate]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

if __name__ == "__main__" and not __package__:  # run as `python benchmarks/NAME.py`: the checkout's root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # makes `benchmarks.*` importable

from benchmarks import microbench_tables as tables  # noqa: E402
from autopar.calibrate.fit import attention_row_time_s, predict_collective_s, predict_host_row_us  # noqa: E402
from autopar.calibrate.measurements import GemmMeasurement, HostMeasurement  # noqa: E402
from costmodels.compute import gemm_efficiency  # noqa: E402
from costmodels.hardware import HardwareProfile, load_profile  # noqa: E402
from costmodels.host import HOST_FIELDS  # noqa: E402
from costmodels.moe_kernels import grouped_gemm_time_s, has_grouped_curve  # noqa: E402


def predict_s(profile: HardwareProfile, measurement) -> float:
    if isinstance(measurement, GemmMeasurement) and measurement.kind == "grouped_gemm" \
            and has_grouped_curve(profile, measurement.precision):  # without the curve: the dense one, as the model
        return float(grouped_gemm_time_s(profile, np.array(measurement.flops), np.array(measurement.m),
                                         np.array(measurement.n), np.array(measurement.k), measurement.precision))
    if isinstance(measurement, GemmMeasurement) and measurement.kind == "attention":
        return attention_row_time_s(profile, measurement)   # the kernel, plus any host dispatch the harness timed
    if isinstance(measurement, GemmMeasurement):
        rate = profile.peak_flops_per_s[measurement.precision] * float(
            gemm_efficiency(profile, measurement.m, measurement.n, measurement.k, measurement.precision))
        return measurement.flops / rate
    if isinstance(measurement, HostMeasurement):   # the profile's host: section (costmodels.host), µs
        values_us = {key: getattr(profile.host_costs, key[:-3] + "_s") * 1e6 for key in HOST_FIELDS}
        return predict_host_row_us(measurement, values_us) * 1e-6
    return predict_collective_s(profile, measurement)


FITTED_ROLES = ("fit", tables.SMALL_GEMM_ROLE)
"""Roles of the rows a bundled value was fitted to: the curves', and the small GEMMs' (tile side, kernel floor)."""


def errors(rows: list[tables.Row], profiles: dict[str, HardwareProfile], role: "str | tuple[str, ...]") -> np.ndarray:
    """|predicted / measured − 1| of each row of the role (or roles), with the first of its profiles (a row feeding
    two profiles of one GPU, a100-80gb and a100-40gb, counts once)."""
    roles = (role,) if isinstance(role, str) else role
    out = [abs(tables.relative_error(predict_s(profiles[row.profiles[0]], row.measurement),
                                     row.measurement.timing.median_s))
           for row in rows if row.role in roles and row.profiles[0] in profiles]
    return np.array(out, dtype=float)


def _stats(values: np.ndarray) -> str:
    if values.size == 0:
        return f"{'-':>7} {'-':>7} {0:>5}"
    return f"{100 * np.median(values):>6.1f}% {100 * np.max(values):>6.1f}% {values.size:>5}"


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cross-validate", action="store_true",
                        help="also refit leaving each source file out and print its held-out errors")
    args = parser.parse_args(argv)
    rows_by_file = tables.all_rows()
    profiles = {name: load_profile(name) for name in tables.PROFILES}
    feeds = {table.file: table.feeds for table in tables.TABLES}
    print(f"{'file':<56} {'fit median':>10} {'max':>7} {'rows':>5}   {'check median':>12} {'max':>7} {'rows':>5}"
          "   feeds")
    fitted_all = []
    files = 0
    for file, rows in rows_by_file.items():
        fit_errors = errors(rows, profiles, FITTED_ROLES)
        check_errors = errors(rows, profiles, "check")
        fitted_all.append(fit_errors)
        files += bool(fit_errors.size)
        print(f"{file:<56} {_stats(fit_errors):>24}   {_stats(check_errors):>26}   {feeds[file]}")
        grouped = [row for row in rows if getattr(row.measurement, "kind", "") == "grouped_gemm"]
        if grouped and len(grouped) < len(rows):  # a mixed file's grouped rows against the grouped-GEMM roofline
            print(f"{'  of which grouped_gemm rows (grouped roofline)':<56} "
                  f"{_stats(errors(grouped, profiles, 'fit')):>24}   {'':>26}   grouped_peak_fraction, "
                  "grouped_hbm_efficiency (H100)")
        reasons = sorted({row.why for row in rows if row.role == "check"})
        for reason in reasons:
            print(f"{'':<8}check only: {reason}")
    for file, why in tables.UNUSED.items():
        print(f"{file:<56} {'not fed':>24}   {'':>26}   {why}")
    everything = np.concatenate(fitted_all)
    print(f"fidelity-microbench: files={files} median={100 * np.median(everything):.1f}% "
          f"max={100 * np.max(everything):.1f}% rows={everything.size}")
    if args.cross_validate:
        from benchmarks import fit_microbench

        print("\nleave one source file out (refit every profile without it, predict its rows):")
        print(f"{'held-out file':<56} {'median':>7} {'max':>7} {'rows':>5}   in-sample median")
        held = []
        for file, rows in rows_by_file.items():
            if not any(row.role in FITTED_ROLES for row in rows):
                continue
            refitted = {name: result[0] for name, result in fit_microbench.fit_all(rows_by_file, exclude=file).items()}
            out = errors(rows, refitted, FITTED_ROLES)
            held.append(out)
            print(f"{file:<56} {_stats(out)}   {100 * np.median(errors(rows, profiles, FITTED_ROLES)):.1f}%")
        allheld = np.concatenate(held)
        print(f"fidelity-microbench-loso: files={len(held)} median={100 * np.median(allheld):.1f}% "
              f"max={100 * np.max(allheld):.1f}% rows={allheld.size}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
