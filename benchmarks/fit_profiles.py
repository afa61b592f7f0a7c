"""Refit the fitted numbers of the A100 profiles from published runs, print the residuals, optionally write back.

Fitted (global, physical) parameters, by least squares on log(predicted / published) over every row of
shared/reference/megatron_2104.04473_table1.csv (TFLOP/s) and the iteration times of korthikanti_2205.05198.csv
(the MFU column is a function of the sp+selective time, so it is not fitted twice):

- compute.gemm_efficiency.peak_fraction       large-GEMM fraction of the bf16 peak
- compute.gemm_efficiency.half_saturation_dim  GEMM side at which efficiency halves (costmodels.compute)
- elementwise.traffic_per_activation_byte     HBM bytes moved per stored activation byte by non-GEMM kernels
- links.nvlink.bandwidth_efficiency           achieved / nominal NVLink bandwidth (TP collectives dominate)

Levenberg–Marquardt in numpy (no scipy), parameters in log space. Both A100 profiles (40 GB and 80 GB) get the
fitted values: same chip, same links. H100/H200/B200 keep their spec sheets and documented assumptions.

    python benchmarks/fit_profiles.py                                # the whole end-to-end fit, printed only
    python benchmarks/fit_profiles.py --elementwise-only [--write]   # the one value still fitted end to end

Since the bundled profiles' GEMM curves and collectives are fitted to component microbenchmarks
(benchmarks/fit_microbench.py), those take precedence: `--elementwise-only` refits only
traffic_per_activation_byte — the residual memory-bound work the cost model does not itemise yet (norms,
activations, dropout, launches) — with everything else held at its microbenchmark fit, and `--write` then writes only
that value (all five profiles: same kernels). It is the one value still fitted end to end.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

if __name__ == "__main__" and not __package__:  # run as `python benchmarks/NAME.py`: the checkout's root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # makes `benchmarks.*` importable

from autopar.atomic_write import write_text_atomically  # noqa: E402
from benchmarks import fidelity_time  # noqa: E402
from costmodels.hardware import HardwareProfile, LinkSpec, load_profile  # noqa: E402

PROFILES_DIR = Path(__file__).resolve().parent.parent / "costmodels" / "profiles"
FITTED_PROFILES = ("a100-80gb", "a100-40gb")
DERIVED_PROFILES = ("a800-80gb", "h100-80gb", "h200-141gb", "b200-180gb", "h800-80gb", "gb200-186gb")
PARAMETERS = ("peak_fraction", "half_saturation_dim", "traffic_per_activation_byte", "nvlink_bandwidth_efficiency")
UPPER_BOUNDS = {"peak_fraction": 1.0, "nvlink_bandwidth_efficiency": 1.0}
LOWER_BOUND = 1e-3
"""Every fitted parameter is a positive quantity; the floor keeps the log-space fit finite when one runs to zero (a
half-saturation side of 0.001 is, for these GEMM shapes, a GEMM at its peak fraction)."""
ITERATIONS = 60
"""Levenberg-Marquardt iterations at most (the fits here stop earlier, when no step improves)."""
FIT_ROWS = "megatron_2104.04473_table1.csv (10 rows, TFLOP/s) + korthikanti_2205.05198.csv (8 iteration times)"


def with_parameters(profile: HardwareProfile, values: dict[str, float]) -> HardwareProfile:
    """A copy of `profile` with the fitted parameters replaced."""
    gemm = dict(profile.gemm_efficiency, peak_fraction=values["peak_fraction"],
                half_saturation_dim=values["half_saturation_dim"])
    extra = dict(profile.extra)
    extra["elementwise"] = dict(extra.get("elementwise", {}) or {},
                                traffic_per_activation_byte=values["traffic_per_activation_byte"])
    nvlink = profile.links["nvlink"]
    links = dict(profile.links)
    links["nvlink"] = LinkSpec(bandwidth_bytes_per_s=nvlink.nominal_bandwidth_bytes_per_s
                               * values["nvlink_bandwidth_efficiency"],
                               alpha_s=nvlink.alpha_s, nominal_bandwidth_bytes_per_s=nvlink.nominal_bandwidth_bytes_per_s)
    return replace(profile, gemm_efficiency=gemm, extra=extra, links=links)


def link_level_nvlink(profile: HardwareProfile) -> HardwareProfile:
    """The profile without its NVLink per-collective points, so that links.nvlink prices every NVLink collective:
    what fitting `nvlink_bandwidth_efficiency` end to end needs (the points, fitted to NCCL microbenchmarks by
    benchmarks/fit_microbench.py, would otherwise take precedence and the parameter would do nothing)."""
    return replace(profile, collectives={link: kinds for link, kinds in profile.collectives.items() if link != "nvlink"})


def current_parameters(profile: HardwareProfile) -> dict[str, float]:
    nvlink = profile.links["nvlink"]
    return {"peak_fraction": profile.gemm_efficiency["peak_fraction"],
            "half_saturation_dim": profile.gemm_efficiency["half_saturation_dim"],
            "traffic_per_activation_byte": float((profile.extra.get("elementwise") or {})
                                                 .get("traffic_per_activation_byte", 1.0)),
            "nvlink_bandwidth_efficiency": nvlink.bandwidth_bytes_per_s / nvlink.nominal_bandwidth_bytes_per_s}


def fit_rows(profile: HardwareProfile) -> list[fidelity_time.FidelityRow]:
    return [r for r in fidelity_time.fidelity_time_rows(profile) if r.metric != "MFU %"]


def residuals(profile: HardwareProfile, values: dict[str, float], keep: "np.ndarray | None" = None) -> np.ndarray:
    """log(predicted / published) per fitted row (only the rows where `keep` is true, when given)."""
    rows = fit_rows(with_parameters(profile, values))
    result = np.array([np.log(r.predicted / r.published) for r in rows])
    return result if keep is None else result[keep]


def _clip(values: dict[str, float]) -> dict[str, float]:
    return {k: min(max(v, LOWER_BOUND), UPPER_BOUNDS.get(k, np.inf)) for k, v in values.items()}


def levenberg_marquardt(profile: HardwareProfile, start: dict[str, float], iterations: int = ITERATIONS,
                        keep: "np.ndarray | None" = None, free: tuple[str, ...] = PARAMETERS) -> dict[str, float]:
    """Minimise Σ residual² over the log of the `free` parameters (the others stay at `start`); numerical Jacobian,
    adaptive damping."""
    x = np.log([start[k] for k in free])

    def values_of(vector):
        return _clip({**start, **dict(zip(free, np.exp(vector)))})

    r = residuals(profile, values_of(x), keep)
    damping = 1e-2
    for _ in range(iterations):
        jacobian = np.empty((len(r), len(x)))
        for j in range(len(x)):
            step = np.zeros_like(x)
            step[j] = 1e-4
            jacobian[:, j] = (residuals(profile, values_of(x + step), keep) - r) / 1e-4
        gradient = jacobian.T @ r
        normal = jacobian.T @ jacobian
        improved = False
        for _ in range(12):
            delta = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12), -gradient)
            clipped = values_of(x + delta)
            candidate = np.log([clipped[k] for k in free])
            trial = residuals(profile, values_of(candidate), keep)
            if trial @ trial < r @ r:
                x, r, damping, improved = candidate, trial, damping / 3, True
                break
            damping *= 4
        if not improved or np.max(np.abs(delta)) < 1e-6:
            break
    return values_of(x)


def _set(text: str, pattern: str, value: str) -> str:
    new, count = re.subn(pattern, rf"\g<1>{value}", text)
    assert count == 1, f"pattern {pattern!r} matched {count} times"
    return new


def _set_provenance(text: str, key: str, note: str) -> str:
    note = json.dumps(note)                                   # a YAML double-quoted scalar: colons are safe
    if re.search(rf"\n  {re.escape(key)}: ", text):
        return re.sub(rf"(\n  {re.escape(key)}: ).*", lambda m: m.group(1) + note, text)
    return text.replace("\nprovenance:\n", f"\nprovenance:\n  {key}: {note}\n", 1)


def write_elementwise(value: float) -> None:
    """Write traffic_per_activation_byte into every bundled profile, with its provenance."""
    note = (f"fitted by benchmarks/fit_profiles.py --elementwise-only to {FIT_ROWS}, the GEMM curve and collectives "
            "held at their microbenchmark fit (benchmarks/fit_microbench.py): the one value still fitted end to end, "
            "standing for memory-bound work not itemised yet")
    for name in (*FITTED_PROFILES, *DERIVED_PROFILES):
        path = PROFILES_DIR / f"{name}.yaml"
        text = _set(path.read_text(encoding="utf-8"), r"(\n  traffic_per_activation_byte: )[0-9.eE+-]+", f"{value:.3f}")
        text = _set_provenance(text, "elementwise.traffic_per_activation_byte",
                               note if name in FITTED_PROFILES else f"{note}; same kernels as A100")
        write_text_atomically(path, text)
        print(f"wrote {path}")


def cross_validate(profile: HardwareProfile, start: dict[str, float],
                   free: tuple[str, ...] = PARAMETERS) -> list[tuple[str, float]]:
    """Leave one published run out (a Table 1 row, or both Korthikanti rows of one model), refit on the rest,
    predict it: the out-of-sample error of the fitted profile."""
    rows = fit_rows(profile)
    runs = [r.label.rsplit(" ", 1)[0] if r.source.startswith("korthikanti") else r.label for r in rows]
    held_out = []
    for run in dict.fromkeys(runs):
        keep = np.array([name != run for name in runs])
        fitted = levenberg_marquardt(profile, start, keep=keep, free=free)
        errors = residuals(profile, fitted)[~keep]
        for row, error in zip([r for r, name in zip(rows, runs) if name == run], errors):
            held_out.append((f"{row.source} {row.label}", 100.0 * (np.exp(error) - 1.0)))
    return held_out


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the fitted values into the A100 YAMLs")
    parser.add_argument("--cross-validate", action="store_true",
                        help="also refit leaving each published run out and print its out-of-sample error (slow)")
    parser.add_argument("--elementwise-only", action="store_true",
                        help="fit only traffic_per_activation_byte (GEMM and links stay at their microbenchmark fit)")
    args = parser.parse_args(argv)
    profile = load_profile(FITTED_PROFILES[0])
    if not args.elementwise_only:
        profile = link_level_nvlink(profile)
    start = current_parameters(profile)
    free = ("traffic_per_activation_byte",) if args.elementwise_only else PARAMETERS
    fitted = levenberg_marquardt(profile, start, free=free)
    before = residuals(profile, start)
    after = residuals(profile, fitted)
    print(f"{'parameter':<30} {'start':>10} {'fitted':>10}")
    for key in PARAMETERS:
        print(f"{key:<30} {start[key]:>10.4f} {fitted[key]:>10.4f}")
    print(f"\n{'row':<58} {'published':>10} {'predicted':>10} {'resid %':>8}")
    for row in fit_rows(with_parameters(profile, fitted)):
        print(f"{row.source + ' ' + row.label:<58} {row.published:>10.2f} {row.predicted:>10.2f} "
              f"{row.error_pct:>+8.2f}")
    print(f"rms log-residual: before {np.sqrt(np.mean(before ** 2)):.4f}, after {np.sqrt(np.mean(after ** 2)):.4f}"
          f" over {len(after)} rows")
    if args.cross_validate:
        held_out = cross_validate(profile, fitted, free)
        print("\nleave-one-run-out (refit without the run, then predict it):")
        for label, error in held_out:
            print(f"{label:<58} {error:>+8.2f}")
        errors = np.abs([e for _, e in held_out])
        print(f"out-of-sample: mean_err={errors.mean():.2f}% max_err={errors.max():.2f}% rows={len(errors)}")
    if args.write and args.elementwise_only:
        write_elementwise(fitted["traffic_per_activation_byte"])
    elif args.write:  # the whole end-to-end fit would overwrite values fitted to component measurements
        print("not written: the GEMM curve and the NVLink collectives are fitted to microbenchmarks "
              "(python benchmarks/fit_microbench.py --write); write only the elementwise traffic with "
              "--elementwise-only --write", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
