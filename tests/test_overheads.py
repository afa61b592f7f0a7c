"""FP8 cast traffic and the fused-attention backward (costmodels/compute.py): each counted value checked against its
source, each term against hand math. The host's per-launch costs are tests/test_host.py's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from costmodels import compute, steptime
from costmodels.hardware import load_profile
from costmodels.plan import Plan, PlanArrays
from costmodels.specs import ModelSpec, Precision, TrainingSpec

H100 = load_profile("h100-80gb")
LLAMA_8B = ModelSpec(name="llama-8b", hidden_size=4096, num_layers=32, num_attention_heads=32, num_kv_heads=8,
                     ffn_hidden_size=14336, vocab_size=128256)


def test_fp8_casts_cost_hbm_traffic(monkeypatch):
    plans = PlanArrays.from_plans([Plan(tp=1, mbs=1)])
    bf16 = TrainingSpec(seq_len=8192, global_batch_size=8)
    fp8 = dataclasses.replace(bf16, precision=Precision.FP8)
    tokens = np.array([8192.0])
    gemms = compute.mlp_gemms(LLAMA_8B, tokens, LLAMA_8B.ffn_hidden_size, np.array([1.0]))
    # up (gated: 2F wide) reads an 8192 x 4096 input, down an 8192 x 14336 one; delayed scaling on Hopper, no norm
    # fused in: read 2 bytes, write the fp8 copy and its transpose, 4 bytes per input element
    mlp_bytes = 4.0 * 8192 * (4096 + 14336)
    assert compute.fp8_cast_bytes(gemms, H100, fp8, plans)[0] == pytest.approx(mlp_bytes)
    assert np.all(compute.fp8_cast_bytes(gemms, H100, bf16, plans) == 0)
    attention = compute.attention_gemms(LLAMA_8B, fp8, plans)
    # the layer's own MLP has the pre-MLP norm fused into fc1 (TE LayerNormLinear): delayed casts in the norm there
    layer_mlp = compute.mlp_gemms(LLAMA_8B, tokens, LLAMA_8B.ffn_hidden_size, np.array([1.0]), norm_fused=True)
    layer_bytes = compute.fp8_cast_bytes(layer_mlp, H100, fp8, plans)[0] + compute.fp8_cast_bytes(attention, H100, fp8,
                                                                                                  plans)[0]
    assert compute.fp8_cast_bytes(layer_mlp, H100, fp8, plans)[0] == pytest.approx(8192 * (2.0 * 4096 + 4.0 * 14336))
    with_casts = compute.layer_times_s(LLAMA_8B, H100, fp8, plans).dense_layer_fwd_s[0]
    monkeypatch.setattr(compute, "fp8_cast_bytes_per_element", lambda *args, **kwargs: (0.0, 0.0))
    without = compute.layer_times_s(LLAMA_8B, H100, fp8, plans).dense_layer_fwd_s[0]
    assert with_casts - without == pytest.approx(layer_bytes / H100.hbm_bandwidth_bytes_per_s)
    assert with_casts < compute.layer_times_s(LLAMA_8B, H100, bf16, plans).dense_layer_fwd_s[0]


def test_flash_attention_backward_is_two_and_a_half_forward_flops_at_the_backward_rate():
    plans = PlanArrays.from_plans([Plan(tp=1, mbs=1, zero=1)])
    flash = TrainingSpec(seq_len=8192, global_batch_size=8)
    times = compute.layer_times_s(LLAMA_8B, H100, flash, plans)
    forward, backward, _ = steptime.stage_compute_s(LLAMA_8B, flash, plans, times, np.array([0]))
    core_bwd = times.attention_core_bwd_s[0]
    # (one stage: it also holds the loss, whose backward has its own byte count, compute.LOSS_BYTES_PER_LOGIT)
    gemm_forward = forward[0] - times.loss_fwd_s[0]
    assert backward[0] == pytest.approx(2.0 * gemm_forward + times.loss_bwd_s[0] + LLAMA_8B.num_layers
                                        * (core_bwd - 2.0 * times.attention_core_fwd_s[0]))
    core = [g for g in compute.attention_gemms(LLAMA_8B, flash, plans) if g.attention_core][0]
    kernel = compute.resolve_attention_kernel(H100, flash)
    bwd_rate = H100.peak_flops_per_s["bf16"] * compute.attention_efficiency(H100, 8192, 8192, 128, kernel, "bwd")
    fwd_rate = H100.peak_flops_per_s["bf16"] * compute.attention_efficiency(H100, 8192, 8192, 128, kernel, "fwd")
    sustained = H100.sustained_clock_fraction          # the step's clock against the benchmarks' burst clock
    assert core_bwd == pytest.approx(2.5 * core.flops[0] / bwd_rate / sustained)
    assert times.attention_core_fwd_s[0] == pytest.approx(core.flops[0] / fwd_rate / sustained)
    assert bwd_rate < fwd_rate  # every measured fused backward runs below its forward
    unfused = dataclasses.replace(flash, flash_attention=False)
    plain = compute.layer_times_s(LLAMA_8B, H100, unfused, plans)
    assert plain.attention_core_bwd_s[0] == pytest.approx(2.0 * plain.attention_core_fwd_s[0])
    assert compute.attention_core_backward_to_forward(unfused) == 2.0
