"""GEMMs below the curve's plateau (costmodels.compute.gemm_efficiency): an output of fewer tiles than the GPU has SMs
(`tile_side`) and the kernel's fixed time (`kernel_floor_us`), fitted to the cuBLAS sweeps at small sizes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from costmodels import compute, steptime
from costmodels.hardware import load_profile
from costmodels.plan import Plan, PlanArrays
from costmodels.specs import ClusterSpec, Engine, ExpertGemm, TrainingSpec

SMALL_TERMS = (compute.TILE_SIDE, compute.KERNEL_FLOOR_US)


def without_small_terms(profile):
    return dataclasses.replace(profile, gemm_efficiency={k: v for k, v in profile.gemm_efficiency.items()
                                                         if k not in SMALL_TERMS})


@pytest.mark.parametrize("gpu, measured_tflops", [("a100-80gb", 104.86), ("h100-80gb", 121.14)])
def test_a_1024_cubed_gemm_runs_as_the_cublas_sweep_measured_it(gpu, measured_tflops):
    """triton-lang/triton #3551 (A100) and #3672 (H100), tutorial 03's cuBLAS column at 1024³
    (shared/reference/microbench/gemm_cublas_fp16_vs_size_triton_tutorial_issues.csv): within 15%, where the plateau
    and roll-off alone promise about twice (A100) and three and a half times (H100) as much."""
    profile = load_profile(gpu)
    peak_tflops = profile.peak_flops_per_s["bf16"] / 1e12
    predicted = float(compute.gemm_efficiency(profile, 1024, 1024, 1024)) * peak_tflops
    assert predicted == pytest.approx(measured_tflops, rel=0.15)
    assert float(compute.gemm_efficiency(without_small_terms(profile), 1024, 1024, 1024)) * peak_tflops \
        > 2.0 * measured_tflops


def test_occupancy_counts_output_tiles_against_sms():
    h100 = load_profile("h100-80gb")
    side, sms = h100.gemm_efficiency[compute.TILE_SIDE], h100.streaming_multiprocessors
    # a small model's QKV at tp 8: 1024 tokens x 384 columns
    assert float(compute.gemm_occupancy(h100, 1024, 384)) == pytest.approx((1024 / side) * (384 / side) / sms)
    # a side shorter than a tile is one tile (a router's n = experts): its traffic, not idle SMs, bounds it
    assert float(compute.gemm_occupancy(h100, 4096, 8)) == pytest.approx(4096 / side / sms)
    # GEMMs run together fill the GPU together; a large output fills it on its own
    assert float(compute.gemm_occupancy(h100, 1024, 384, concurrent=4)) == pytest.approx(
        4 * float(compute.gemm_occupancy(h100, 1024, 384)))
    assert float(compute.gemm_occupancy(h100, 8192, 8192)) == 1.0
    assert float(compute.gemm_occupancy(without_small_terms(h100), 64, 64)) == 1.0


def test_large_gemms_keep_the_plateau_and_fp8_takes_neither_term():
    for gpu in ("a100-80gb", "h100-80gb", "b200-180gb"):
        profile = load_profile(gpu)
        plain = without_small_terms(profile)
        big = (8192, 8192, 8192)
        assert float(compute.gemm_efficiency(profile, *big)) == pytest.approx(
            float(compute.gemm_efficiency(plain, *big)), rel=0.01)
        assert float(compute.gemm_efficiency(profile, 512, 512, 512)) < \
            0.5 * float(compute.gemm_efficiency(plain, 512, 512, 512))
        if profile.supports("fp8"):
            assert float(compute.gemm_efficiency(profile, 512, 512, 512, "fp8")) == \
                float(compute.gemm_efficiency(plain, 512, 512, 512, "fp8"))


def test_the_kernel_floor_is_paid_once_per_kernel():
    """A batch of GEMMs in one kernel (the unfused attention core's bmm over heads) or on parallel streams pays one
    floor between them; GEMMs run one after another pay one each."""
    h100 = load_profile("h100-80gb")
    only_floor = dataclasses.replace(h100, gemm_efficiency={**h100.gemm_efficiency, compute.TILE_SIDE: 0.0})
    one = compute.gemm_time_s(only_floor, 2.0 * 256**3, 256, 256, 256, "bf16")
    batched = compute.gemm_time_s(only_floor, 8 * 2.0 * 256**3, 256, 256, 256, "bf16", concurrent=8)
    serial = compute.gemm_time_s(only_floor, 8 * 2.0 * 256**3, 256, 256, 256, "bf16")
    floor_s = h100.gemm_efficiency[compute.KERNEL_FLOOR_US] * 1e-6
    assert float(serial - batched) == pytest.approx(7 * floor_s)
    assert float(one) > floor_s


def test_gemm_families_say_how_many_fill_the_gpu_together():
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    core = compute.Gemm(flops=np.array([2.0 * 4096 * 4096 * 128 * 32]), m=np.array([4096.0]),
                        n=np.array([4096.0]), k=np.array([128.0]), attention_core=True)
    assert core.concurrent(training)[0] == 32.0
    experts = compute.Gemm(flops=np.array([2.0 * 256 * 768 * 2048 * 16]), m=np.array([256.0]),
                           n=np.array([768.0]), k=np.array([2048.0]), grouped=True)
    assert experts.concurrent(training)[0] == compute.TE_COMPUTE_STREAMS       # TE's four compute streams
    assert experts.concurrent(dataclasses.replace(training, expert_gemm=ExpertGemm.LOOP)) == 1.0
    linear = compute.Gemm(flops=np.array([2.0 * 4096 * 1024 * 1024]), m=np.array([4096.0]), n=np.array([1024.0]),
                          k=np.array([1024.0]))
    assert linear.concurrent(training) == 1.0


def test_a_small_model_at_tp_8_computes_slower_than_the_plateau_says():
    """Issue 42's small models: at tp 8 a 1B model's GEMMs are 1024 tokens by a few hundred columns, far below the
    plateau; the compute term grows by more than a third."""
    model = __import__("autopar.models", fromlist=["load_model"]).load_model("llama-3.2-1b")
    training = TrainingSpec(seq_len=1024, global_batch_size=64, engine=Engine.PYTORCH)
    plans = PlanArrays.from_plans([Plan(tp=8, mbs=1, sp=False)])
    profile = load_profile("a100-80gb")

    def compute_s(p):
        return float(steptime.step_time_terms_s(model, ClusterSpec(profile=p, num_gpus=8), training, plans,
                                                only=("compute",))["compute"][0])

    assert compute_s(profile) > 1.33 * compute_s(without_small_terms(profile))
