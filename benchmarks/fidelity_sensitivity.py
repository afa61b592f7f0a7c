"""What the largest residuals of benchmarks/fidelity_runs.py would become under the mechanisms proposed for them,
each applied to every published row at once: evidence for or against each, not a fit.

fidelity_runs.py compares the bundled model with the published runs; some of its worst sources share a suspect (the
H100 rows of llm-foundry's long-sequence sweeps, the small models of llm.c and modded-nanogpt, the Megatron rows on
H100). Each variant here switches one mechanism on or off for every row, not for the rows it would help, and the
table says what it does to every source and category. A variant that mends one source and breaks others is evidence
against the mechanism as stated (or for a second error that cancels it elsewhere); one that helps everywhere is a
candidate for the model, once a component measurement pins it. Nothing here changes a bundled profile or a row.

- `burst-clock`: compute at the clock the microbenchmarks ran at, no power-limit throttle (every profile's
  compute.sustained_clock_fraction 1 in place of H100/H200/H800 0.795, B200/GB200 0.804).
- `triton-mma-sync`: llm-foundry's H100 rows of MPT's Triton attention (TRITON_AS_FA2_NOTE: priced as
  FlashAttention-2 for want of a curve) priced with a Triton curve made as the A100 one is: the kernel comes from
  the pre-MLIR Triton that llm-foundry's gpu extra installs (`triton-pre-mlir@...@triton_pre_mlir_sm90`, setup.py
  at b2a43a147), which issues Ampere's mma.sync on every GPU as FlashAttention-2 does (compute.MMA_SYNC_KERNELS), so
  its rate relative to FlashAttention-2 carries over from A100: the GPU's FlashAttention-2 curve at 1/1.4 forward
  and 1/2 backward (benchmarks/microbench_tables.py FA2_SPEEDUP, the FA2 paper's A100 ratios).
- `triton-mma-sync+burst-clock`: both.
- `elementwise-once`: the memory-bound kernels move each stored activation byte once (the profile's
  elementwise.traffic_per_activation_byte 1 in place of 2.842, the one value fitted end to end, on the 2021-22
  Megatron tables: benchmarks/fit_profiles.py --elementwise-only).

    python benchmarks/fidelity_sensitivity.py

Prints MAPE and bias per source and category for the bundled model and each variant, then one line per variant:
`fidelity-sensitivity: VARIANT mape=X% dense_A100=A% dense_H100/H200=H% MoE=M% small-kernel=S%`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as `python benchmarks/NAME.py`: the checkout's root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # makes `benchmarks.*` importable

from benchmarks import fidelity_runs  # noqa: E402
from benchmarks.fidelity_runs import Case, Result, Summary, TRITON_AS_FA2_NOTE  # noqa: E402
from benchmarks.microbench_tables import FA2_SPEEDUP  # noqa: E402
from costmodels import compute as compute_model  # noqa: E402
from costmodels.hardware import HardwareProfile  # noqa: E402
from costmodels.specs import AttentionKernel  # noqa: E402

ELEMENTWISE_ONCE = 1.0
"""`elementwise-once`: HBM bytes moved per stored activation byte."""


def with_profile(case: Case, profile: HardwareProfile) -> Case:
    return dataclasses.replace(case, cluster=dataclasses.replace(case.cluster, profile=profile))


def burst_clock(case: Case) -> Case:
    """Compute at the microbenchmarks' clock: no sustained-clock drop."""
    return with_profile(case, dataclasses.replace(case.cluster.profile, sustained_clock_fraction=1.0))


def triton_curve(profile: HardwareProfile) -> HardwareProfile:
    """`profile` with a FlashAttention-in-Triton curve per pass: its FlashAttention-2 curve at 1/FA2_SPEEDUP of the
    rate, the same half-saturation (how benchmarks/microbench_tables.py makes the A100 one); a profile that has a
    Triton curve already is returned as it is."""
    if "fa_triton" in compute_model.attention_kernels_of(profile):
        return profile
    curves = dict(profile.gemm_efficiency)
    for attention_pass in compute_model.ATTENTION_PASSES:
        fa2_peak, fa2_half = compute_model.attention_curve_parameters("fa2", attention_pass)
        peak, half = compute_model.attention_curve_parameters("fa_triton", attention_pass)
        curves[peak] = curves[fa2_peak] / FA2_SPEEDUP["fa_triton"][attention_pass]
        curves[half] = curves[fa2_half]
    return dataclasses.replace(profile, gemm_efficiency=curves)


def triton_mma_sync(case: Case) -> Case:
    """The rows whose Triton attention is priced as FlashAttention-2 priced with a Triton curve; the others as they
    are."""
    if TRITON_AS_FA2_NOTE not in case.assumptions:
        return case
    triton = dataclasses.replace(case.training, attention_kernel=AttentionKernel.FA_TRITON)
    return dataclasses.replace(with_profile(case, triton_curve(case.cluster.profile)), training=triton)


def elementwise_once(case: Case) -> Case:
    """Each stored activation byte moved once by the memory-bound kernels."""
    profile = case.cluster.profile
    extra = dict(profile.extra, elementwise=dict(profile.extra.get("elementwise") or {},
                                                 traffic_per_activation_byte=ELEMENTWISE_ONCE))
    return with_profile(case, dataclasses.replace(profile, extra=extra))


VARIANTS: dict[str, Callable[[Case], Case]] = {
    "burst-clock": burst_clock,
    "triton-mma-sync": triton_mma_sync,
    "triton-mma-sync+burst-clock": lambda case: burst_clock(triton_mma_sync(case)),
    "elementwise-once": elementwise_once,
}


def predictions(cases: list[Case], variant: "Callable[[Case], Case] | None") -> list[Result]:
    """Each case priced as it is (`variant` None) or as the variant changes it; the result keeps the original case
    (its source and category), the prediction is the variant's."""
    results = []
    for case in cases:
        result = fidelity_runs.predict(variant(case) if variant else case)
        if result is not None:
            results.append(dataclasses.replace(result, case=case))
    return results


def summaries(results: list[Result]) -> dict[str, Summary]:
    """MAPE and bias per source, per category (fidelity_runs.CATEGORIES) and over all rows ('all')."""
    out = {source: fidelity_runs.summarise([r for r in results if r.case.source == source])
           for source in sorted({r.case.source for r in results})}
    for name in fidelity_runs.CATEGORIES:
        out[name] = fidelity_runs.summarise([r for r in results if fidelity_runs.in_category(r.case, name)])
    out["all"] = fidelity_runs.summarise(results)
    return out


def main() -> int:
    cases = [row for row in fidelity_runs.all_rows() if isinstance(row, Case)]
    columns = {"bundled": summaries(predictions(cases, None))}
    for name, variant in VARIANTS.items():
        columns[name] = summaries(predictions(cases, variant))
    names = list(columns)
    print("MAPE % / bias % per source and category, the bundled model and each variant")
    print(f"{'':<24} {'rows':>5}" + "".join(f" {name[:27]:>27}" for name in names))
    for key, base in columns["bundled"].items():
        if not base.rows:
            continue
        cells = "".join(f" {columns[name][key].mape:>17.1f} {columns[name][key].bias:>+9.1f}" for name in names)
        print(f"{key:<24} {base.rows:>5}{cells}")
    print()
    for name in names[1:]:
        s = columns[name]
        categories = " ".join(f"{category.replace(' ', '_')}={s[category].mape:.1f}%"
                              for category in fidelity_runs.CATEGORIES if s[category].rows)
        print(f"fidelity-sensitivity: {name} mape={s['all'].mape:.1f}% {categories}")
    base = columns["bundled"]
    categories = " ".join(f"{category.replace(' ', '_')}={base[category].mape:.1f}%"
                          for category in fidelity_runs.CATEGORIES if base[category].rows)
    print(f"fidelity-sensitivity: bundled mape={base['all'].mape:.1f}% {categories}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
