"""Published layouts come out near the top of the front (benchmarks/published_layouts.py prints the figures).

For every row of Megatron-LM Table 1 (arXiv 2104.04473) and Korthikanti et al. (arXiv 2205.05198): the published
layout is feasible in our model, and its predicted step time is within 10% of the best front point at or below its
peak memory. What the search is given, and why, is in the benchmark's docstring.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import published_layouts

# Rows where the model disagrees with the published choice (issue 4 stays open on them): the model puts tp2 or tp4
# with interleaved PP 14-19% ahead of the published tp8 for the three models of hidden size 6144 and 8192, while it
# reproduces the measured speed of those tp8 runs within 2.3%, 2.4% and 4.0% (benchmarks/fidelity_time.py).
# The papers did not measure the alternatives; GPT-NeoX-20B (hidden 6144, A100) trained at tp2 pp4 rather than tp8,
# the same 8-way model parallelism. Nor is it the fit's split of TP collective time from the other tp-dependent costs: with
# NVLink pinned at 0.77 and the rest refitted, the gaps stay above 10% (at a lossless 1.0: 14.5%, 10.4%, 8.5%)
# (`python benchmarks/published_layouts.py --nvlink-efficiency E`).
KNOWN_DISAGREEMENTS = pytest.mark.xfail(
    strict=True, reason="the model prices tp2/tp4 + interleaved PP 14-19% faster than the published tp8 layout for the "
                        "hidden-6144/8192 models with NCCL-fitted NVLink collectives (see the comment above)")
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


def test_pinned_nvlink_refit_prices_nvlink_at_the_pinned_value_and_is_used():
    # the bundled NVLink collectives are fitted to NCCL microbenchmarks (per collective and group size); the
    # sensitivity check sets them aside, prices NVLink at the pinned link-level efficiency and refits the rest
    try:
        published_layouts.reference_dir()
    except FileNotFoundError:
        pytest.skip("shared/reference is not next to this checkout")
    from benchmarks import fit_profiles

    half = published_layouts.pinned_nvlink_profile(0.5, iterations=2)        # two refit steps: the whole refit is the
    lossless = published_layouts.pinned_nvlink_profile(1.0, iterations=2)    # benchmark's `--nvlink-efficiency E`
    for pinned, efficiency in ((half, 0.5), (lossless, 1.0)):
        assert "nvlink" not in pinned.profile.collectives
        assert fit_profiles.current_parameters(pinned.profile)["nvlink_bandwidth_efficiency"] == pytest.approx(efficiency)
    assert half.refitted != pytest.approx(lossless.refitted, rel=1e-3)
    case = next(c for c in published_layouts.cases() if c.case_id == "table1-3.6B")   # tp2: collectives matter
    default_s = published_layouts.compare(case).published.step_time_s
    assert published_layouts.compare(case, lossless.profile).published.step_time_s != pytest.approx(default_s,
                                                                                                    rel=1e-3)