"""benchmarks/fidelity_sensitivity.py: each variant changes what its docstring says, on the rows it names, and a
prediction under a variant keeps the row it came from."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks import fidelity_runs, fidelity_sensitivity
from benchmarks.microbench_tables import FA2_SPEEDUP
from costmodels import compute as compute_model
from costmodels.hardware import load_profile
from costmodels.specs import AttentionKernel


@pytest.fixture(scope="module")
def cases():
    try:
        reference = fidelity_runs.reference_dir()
    except FileNotFoundError:
        pytest.skip("shared/reference is not next to this checkout")
    if not (reference / "runs").is_dir():
        pytest.skip("shared/reference/runs not present")
    return [row for row in fidelity_runs.all_rows() if isinstance(row, fidelity_runs.Case)]


def test_triton_curve_is_flashattention2_at_the_a100_ratios():
    h100 = load_profile("h100-80gb")
    assert "fa_triton" not in compute_model.attention_kernels_of(h100)
    triton = fidelity_sensitivity.triton_curve(h100)
    for attention_pass in compute_model.ATTENTION_PASSES:
        fa2_peak, fa2_half = compute_model.attention_curve_parameters("fa2", attention_pass)
        peak, half = compute_model.attention_curve_parameters("fa_triton", attention_pass)
        assert triton.gemm_efficiency[peak] == pytest.approx(
            h100.gemm_efficiency[fa2_peak] / FA2_SPEEDUP["fa_triton"][attention_pass])
        assert triton.gemm_efficiency[half] == h100.gemm_efficiency[fa2_half]
    # slower than FlashAttention-2 in both passes, by 1.4 forward and 2 backward
    assert FA2_SPEEDUP["fa_triton"] == {"fwd": 1.4, "bwd": 2.0}
    a100 = load_profile("a100-80gb")                  # has its own Triton curve: left as it is
    assert fidelity_sensitivity.triton_curve(a100) is a100


def test_triton_variant_touches_only_the_rows_priced_as_flashattention2(cases):
    noted = [c for c in cases if fidelity_runs.TRITON_AS_FA2_NOTE in c.assumptions]
    assert noted and all(c.source == "llm-foundry" and c.cluster.profile.name == "h100-80gb" for c in noted)
    for case in noted:
        changed = fidelity_sensitivity.triton_mma_sync(case)
        assert case.training.attention_kernel is AttentionKernel.FA2
        assert changed.training.attention_kernel is AttentionKernel.FA_TRITON
        assert "fa_triton" in compute_model.attention_kernels_of(changed.cluster.profile)
    others = [c for c in cases if fidelity_runs.TRITON_AS_FA2_NOTE not in c.assumptions]
    assert all(fidelity_sensitivity.triton_mma_sync(c) is c for c in others)


def test_clock_and_elementwise_variants_change_one_profile_value(cases):
    case = next(c for c in cases if c.cluster.profile.name == "h100-80gb")
    assert case.cluster.profile.sustained_clock_fraction < 1.0
    burst = fidelity_sensitivity.burst_clock(case).cluster.profile
    assert burst.sustained_clock_fraction == 1.0
    assert dataclasses.replace(burst, sustained_clock_fraction=case.cluster.profile.sustained_clock_fraction) \
        == case.cluster.profile
    once = fidelity_sensitivity.elementwise_once(case).cluster.profile
    assert compute_model.elementwise_traffic_factor(case.cluster.profile) > 1.0
    assert compute_model.elementwise_traffic_factor(once) == fidelity_sensitivity.ELEMENTWISE_ONCE
    assert {k: v for k, v in once.extra.items() if k != "elementwise"} == \
        {k: v for k, v in case.cluster.profile.extra.items() if k != "elementwise"}


def test_a_variant_prediction_keeps_its_row_and_moves_the_time(cases):
    """The H100 Triton rows slow down under the Triton curve (it is slower than FlashAttention-2 in both passes),
    and the result still names the published row, so per-source and per-category tables group it as before."""
    case = next(c for c in cases if fidelity_runs.TRITON_AS_FA2_NOTE in c.assumptions and c.training.seq_len >= 8192)
    base, = fidelity_sensitivity.predictions([case], None)
    triton, = fidelity_sensitivity.predictions([case], fidelity_sensitivity.triton_mma_sync)
    assert triton.case is case and base.case is case
    assert triton.predicted_step_s > base.predicted_step_s
    table = fidelity_sensitivity.summaries([triton])
    assert table["llm-foundry"].rows == 1 and table["dense H100/H200"].rows == 1 and table["all"].rows == 1
