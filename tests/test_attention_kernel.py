"""The fused attention kernel as a training option (--attention-kernel auto|fa2|fa3|cudnn|fa1|fa_triton): each
kernel priced with its own forward and backward curve from the bundled profile, `auto` resolving the way Transformer
Engine does, the CLI / header / JSON / exports carrying it, and the per-kernel fit through `autopar profile fit`'s
path."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from autopar.calibrate.measurements import GemmMeasurement, Measurements, Timing, measurements_from_dict
from autopar.calibrate.profile_file import apply_fit, fit_measurements
from autopar.export import emit
from autopar.megatron_args import parse_megatron_args
from costmodels import compute
from costmodels.errors import InputError
from costmodels.hardware import load_profile
from costmodels.plan import Plan, PlanArrays
from costmodels.specs import AttentionKernel, TrainingSpec
from test_cli import LLAMA_8B, assert_one_line_bad_input, autopar
from test_export_frameworks import overrides
from test_report_support import cluster, dense_model, synthetic_estimate

H100 = load_profile("h100-80gb")
A100 = load_profile("a100-80gb")
B200 = load_profile("b200-180gb")


# ---- the cost model --------------------------------------------------------------------------------------------

def test_auto_resolves_as_transformer_engine_does():
    auto = TrainingSpec()
    assert compute.resolve_attention_kernel(H100, auto) == "cudnn"       # FusedAttention preferred on Hopper+
    assert compute.resolve_attention_kernel(B200, auto) == "cudnn"
    assert compute.resolve_attention_kernel(A100, auto) == "fa2"         # Ampere: FlashAttention-2
    assert compute.attention_kernel_runs(A100, dataclasses.replace(auto, flash_attention=False)) == "unfused"


def test_fa3_is_refused_off_hopper_and_named_kernels_need_a_curve():
    fa3 = TrainingSpec(attention_kernel="fa3")
    assert compute.resolve_attention_kernel(H100, fa3) == "fa3"
    for profile in (A100, B200):
        with pytest.raises(InputError, match="attention_kernel.*no fa3 attention curve"):
            compute.resolve_attention_kernel(profile, fa3)
    with pytest.raises(InputError, match="attention_kernel: unknown attention kernel 'fa4'"):
        TrainingSpec(attention_kernel="fa4")
    assert TrainingSpec(attention_kernel="CUDNN").attention_kernel is AttentionKernel.CUDNN


@pytest.mark.parametrize("kernel", ["fa2", "fa3", "cudnn"])
def test_every_bundled_hopper_curve_rises_with_keys_and_the_backward_runs_below_the_forward(kernel):
    keys = np.array([1024.0, 4096.0, 16384.0, 65536.0])
    forward = compute.attention_efficiency(H100, keys, keys, 128, kernel, "fwd")
    backward = compute.attention_efficiency(H100, keys, keys, 128, kernel, "bwd")
    assert np.all(np.diff(forward) > 0) and np.all(np.diff(backward) > 0)
    assert np.all(backward < forward) and np.all(forward < 1.0)


def test_the_kernel_changes_the_attention_core_only():
    model = dense_model()
    plans = PlanArrays.from_plans([Plan(tp=1, mbs=1, zero=1)])
    times = {kernel: compute.layer_times_s(model, H100, TrainingSpec(seq_len=8192, global_batch_size=8,
                                                                       attention_kernel=kernel), plans)
             for kernel in ("fa2", "fa3", "cudnn")}
    non_core = {k: t.dense_layer_fwd_s[0] - t.attention_core_fwd_s[0] for k, t in times.items()}
    assert non_core["fa2"] == pytest.approx(non_core["fa3"]) == pytest.approx(non_core["cudnn"])
    # FlashAttention-2 (mma.sync) is the slowest on Hopper in both passes; FA3 and cuDNN are measured faster
    for attr in ("attention_core_fwd_s", "attention_core_bwd_s"):
        assert getattr(times["fa2"], attr)[0] > max(getattr(times["fa3"], attr)[0], getattr(times["cudnn"], attr)[0])


@pytest.mark.parametrize("profile, kernel, attention_pass, expected", [
    (A100, "fa2", "fwd", (1 + 128 / 512) / (1 + 128 / 256)),     # mma.sync: 2048 FLOP vs 16 exp2 per SM per clock
    (A100, "fa2", "bwd", (1 + 128 / 1280) / (1 + 128 / 640)),    # 2.5x the matmul FLOPs, one recomputed exp
    (H100, "fa2", "fwd", (1 + 128 / 512) / (1 + 128 / 256)),     # FA2 issues mma.sync on Hopper too
    (H100, "cudnn", "fwd", (1 + 256 / 512) / (1 + 256 / 256)),   # wgmma: 4096
    (B200, "cudnn", "fwd", (1 + 512 / 512) / (1 + 512 / 256)),   # tcgen05: 8192
])
def test_a_head_dim_of_64_runs_the_core_slower_by_its_exponentials_share(profile, kernel, attention_pass, expected):
    factor = compute.attention_head_dim_factor(profile, kernel, attention_pass, np.array([64.0, 128.0, 192.0]))
    assert factor == pytest.approx([expected, 1.0, 1.0])          # measured at 128; above it the curve stands
    assert float(compute.attention_efficiency(profile, 8192, 8192, 64, kernel, attention_pass)) == pytest.approx(
        expected * float(compute.attention_efficiency(profile, 8192, 8192, 128, kernel, attention_pass)))


def test_the_core_of_a_64_wide_head_takes_longer_for_the_same_flops():
    wide = dense_model()                                              # 32 heads of 128
    narrow = dataclasses.replace(wide, num_attention_heads=64, num_kv_heads=16, head_dim=64)  # same FLOPs
    plans = PlanArrays.from_plans([Plan(tp=1, mbs=1, zero=1)])
    training = TrainingSpec(seq_len=8192, global_batch_size=8, attention_kernel="cudnn")
    wide_t, narrow_t = (compute.layer_times_s(m, H100, training, plans) for m in (wide, narrow))
    ratio = narrow_t.attention_core_fwd_s[0] / wide_t.attention_core_fwd_s[0]
    assert ratio == pytest.approx(1.0 / float(compute.attention_head_dim_factor(H100, "cudnn", "fwd", 64.0)))
    assert narrow_t.attention_core_bwd_s[0] / wide_t.attention_core_bwd_s[0] == pytest.approx(
        1.0 / float(compute.attention_head_dim_factor(H100, "cudnn", "bwd", 64.0)))
    unstated = dataclasses.replace(H100, exp2_per_clock_per_sm=0.0)   # a profile that does not state the rates
    assert float(compute.attention_head_dim_factor(unstated, "cudnn", "fwd", 64.0)) == 1.0


def test_a_profile_without_kernel_curves_keeps_the_kernel_less_curve_then_the_gemm_curve():
    legacy = dataclasses.replace(H100, gemm_efficiency={
        **{k: v for k, v in H100.gemm_efficiency.items() if not k.startswith("attention_")},
        "attention_peak_fraction": 0.5, "attention_half_saturation_seq": 1000.0})
    training = TrainingSpec(attention_kernel="fa3")
    assert compute.resolve_attention_kernel(legacy, training) == ""      # nothing to refuse: no per-kernel curves
    assert float(compute.attention_efficiency(legacy, 4000, 4000, 128, "", "bwd")) == pytest.approx(0.4)
    bare = dataclasses.replace(legacy, gemm_efficiency={k: v for k, v in legacy.gemm_efficiency.items()
                                                        if not k.startswith("attention_")})
    assert float(compute.attention_efficiency(bare, 4000, 4000, 128)) == pytest.approx(   # one kernel, every head
        float(compute.gemm_efficiency(bare, 4000, 4000, 128, "bf16", concurrent=np.inf)))


# ---- CLI, header, JSON, exports ------------------------------------------------------------------------------------

def test_cli_flag_reaches_the_header_and_the_json():
    result = autopar("estimate", LLAMA_8B, "--gpu", "h100", "--num-gpus", "8", "--attention-kernel", "fa2", "--json")
    assert result.returncode in (0, 1), result.stderr                  # 1: the default plan may not fit
    training = json.loads(result.stdout)["inputs"]["training"]
    assert training["attention_kernel"] == "fa2" and training["attention_kernel_runs"] == "fa2"
    header = autopar("estimate", LLAMA_8B, "--gpu", "a100", "--num-gpus", "8")
    assert "flash attention on (fa2, auto)" in header.stdout


@pytest.mark.parametrize("argv, must_contain", [
    (["--attention-kernel", "flash4"], ["attention_kernel", "flash4", "fa2"]),
    (["--gpu", "a100", "--attention-kernel", "fa3"], ["attention_kernel", "fa3", "A100"]),
])
def test_bad_kernel_exits_2_with_one_line(argv, must_contain):
    assert_one_line_bad_input(autopar("estimate", LLAMA_8B, "--num-gpus", "8", *argv), must_contain)


@pytest.mark.parametrize("kernel, flash, backend", [
    ("cudnn", True, "fused"), ("fa2", True, "flash"), ("fa3", True, "flash"), ("auto", False, "unfused"),
    ("auto", True, None)])
def test_megatron_and_verl_exports_write_the_attention_backend(kernel, flash, backend):
    training = TrainingSpec(seq_len=4096, global_batch_size=512, attention_kernel=kernel, flash_attention=flash)
    estimate = synthetic_estimate(dense_model(), cluster(64), training, Plan(tp=2, pp=2, mbs=1, zero=1))
    megatron = emit(estimate, "megatron")
    verl = overrides(emit(estimate, "verl"))
    key = "actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend"
    if backend is None:                     # auto is Megatron-Core's default: nothing written
        assert "--attention-backend" not in megatron and key not in verl
    else:
        assert f"--attention-backend {backend}" in megatron and verl[key] == backend
    assert ("FlashAttention-" in megatron) == (kernel in ("fa2", "fa3"))


def test_the_megatron_importer_reads_back_what_the_export_wrote():
    training = TrainingSpec(seq_len=4096, global_batch_size=512, attention_kernel="cudnn")
    estimate = synthetic_estimate(dense_model(), cluster(64), training, Plan(tp=2, pp=2, mbs=1, zero=1))
    run = parse_megatron_args(emit(estimate, "megatron"))
    assert run.training_spec(TrainingSpec()).attention_kernel is AttentionKernel.CUDNN
    unfused = parse_megatron_args("pretrain_gpt.py --bf16 --attention-backend local")
    assert run.training_spec(TrainingSpec()).flash_attention and not unfused.training_spec(TrainingSpec()).flash_attention
    flash = parse_megatron_args("pretrain_gpt.py --bf16 --attention-backend flash")
    assert flash.training["attention_kernel"] == "fa2" and any("FlashAttention-3" in n for n in flash.notes)
    with pytest.raises(InputError, match="--attention-backend 'cudnn': expected one of auto, fused"):
        parse_megatron_args("pretrain_gpt.py --bf16 --attention-backend cudnn")


# ---- the fit -----------------------------------------------------------------------------------------------------

def _rows(kernel: str, attention_pass: str, peak_fraction: float, side: float) -> list[GemmMeasurement]:
    rows = []
    for seq in (1024, 2048, 4096, 8192, 16384):
        rate = H100.peak_flops_per_s["bf16"] * peak_fraction / (1.0 + side / seq)
        seconds = 2.0 * seq * seq * 128 / rate
        rows.append(GemmMeasurement("bf16", seq, seq, 128, Timing(seconds, seconds, seconds, 1), kind="attention",
                                    attention_kernel=kernel, attention_pass=attention_pass, source="synthetic.csv"))
    return rows


def test_profile_fit_recovers_each_kernel_and_pass_and_names_its_source():
    rows = _rows("fa3", "fwd", 0.8, 1200.0) + _rows("fa3", "bwd", 0.6, 2500.0)
    measurements = Measurements(gemm=tuple(rows))
    again = measurements_from_dict(json.loads(json.dumps(measurements.to_dict())), "test")
    assert again.gemm == measurements.gemm
    fit = fit_measurements(again, H100)
    assert set(fit.attention_curves) == {("fa3", "fwd"), ("fa3", "bwd")} and fit.attention is None
    data = {"compute": {"gemm_efficiency": dict(H100.gemm_efficiency)}, "links": {}}
    provenance: dict[str, str] = {}
    apply_fit(data, H100, fit, again, "test fit", provenance, [])
    values = data["compute"]["gemm_efficiency"]
    assert values["attention_fa3_fwd_peak_fraction"] == pytest.approx(0.8, rel=1e-3)
    assert values["attention_fa3_bwd_half_saturation_seq"] == pytest.approx(2500.0, rel=1e-3)
    assert "synthetic.csv" in provenance["compute.gemm_efficiency.attention_fa3_bwd"]


def test_measurements_refuse_a_kernel_on_a_gemm_row_and_an_unknown_pass():
    row = {"precision": "bf16", "m": 1024, "n": 1024, "k": 128, "median_s": 1e-3, "q1_s": 1e-3, "q3_s": 1e-3,
           "runs": 1}
    with pytest.raises(InputError, match="attention_kernel belongs to an attention row"):
        measurements_from_dict({"gemm": [{**row, "attention_kernel": "fa2", "attention_pass": "fwd"}]}, "x.yaml")
    with pytest.raises(InputError, match="attention_pass must be one of fwd, bwd"):
        measurements_from_dict({"gemm": [{**row, "kind": "attention", "attention_kernel": "fa2",
                                          "attention_pass": "both"}]}, "x.yaml")


def test_bundled_extrapolated_curves_say_so_with_their_rule():
    for profile, key in ((A100, "attention_fa2_fwd"), (H100, "attention_cudnn_bwd"), (H100, "attention_fa2_bwd"),
                         (load_profile("h200-141gb"), "attention_fa3_fwd")):
        assert profile.provenance[f"compute.gemm_efficiency.{key}"].startswith("extrapolated ("), (profile.name, key)
    for profile, key in ((H100, "attention_fa3_fwd"), (B200, "attention_fa2_bwd"), (B200, "attention_cudnn_fwd")):
        assert profile.provenance[f"compute.gemm_efficiency.{key}"].startswith("fitted by"), (profile.name, key)


# ---- the kernels FlashAttention-2 replaced (A100 only) ------------------------------------------------------------

@pytest.mark.parametrize("kernel, fwd_speedup, bwd_speedup", [("fa1", 2.0, 2.0), ("fa_triton", 1.4, 2.0)])
def test_fa1_era_kernels_run_at_the_fa2_papers_ratios_on_a100(kernel, fwd_speedup, bwd_speedup):
    """FA2 paper (arXiv 2307.08691) §4.1 on A100: FlashAttention-2 ~2x FlashAttention; 1.3-1.5x FlashAttention in
    Triton forward, ~2x backward. The bundled A100 curves are fitted to FA2's rows at those ratios."""
    keys = np.array([512.0, 2048.0, 8192.0, 65536.0])
    for attention_pass, speedup in (("fwd", fwd_speedup), ("bwd", bwd_speedup)):
        fa2 = compute.attention_efficiency(A100, keys, keys, 128.0, "fa2", attention_pass)
        older = compute.attention_efficiency(A100, keys, keys, 128.0, kernel, attention_pass)
        np.testing.assert_allclose(older * speedup, fa2, rtol=1e-3)
        assert A100.provenance[f"compute.gemm_efficiency.attention_{kernel}_{attention_pass}"].startswith(
            "extrapolated (")


def test_fa1_era_kernels_slow_the_core_and_auto_stays_fa2_on_a100():
    assert compute.resolve_attention_kernel(A100, TrainingSpec()) == "fa2"
    plans = PlanArrays.from_plans([Plan(tp=1, mbs=1)])
    model = dense_model()

    def core_s(kernel: str) -> float:
        training = TrainingSpec(seq_len=16384, attention_kernel=kernel)
        times = compute.layer_times_s(model, A100, training, plans)
        return float(times.attention_core_fwd_s[0] + times.core_backward_s(training)[0])

    assert core_s("fa2") < core_s("fa_triton") < core_s("fa1")


@pytest.mark.parametrize("gpu", ["h100", "b200"])
def test_fa1_era_kernels_are_refused_where_no_source_measured_them(gpu):
    assert_one_line_bad_input(autopar("estimate", LLAMA_8B, "--num-gpus", "8", "--gpu", gpu, "--attention-kernel",
                                      "fa_triton"), ["attention_kernel", "fa_triton"])


def test_megatron_export_leaves_a_fa1_era_kernel_to_transformer_engine_and_says_so():
    training = TrainingSpec(seq_len=4096, global_batch_size=512, attention_kernel="fa_triton")
    estimate = synthetic_estimate(dense_model(), cluster(64, "a100-80gb"), training, Plan(tp=2, pp=2, mbs=1, zero=1))
    megatron = emit(estimate, "megatron")
    assert not any(line.strip().startswith("--attention-backend") for line in megatron.splitlines())
    assert "not a Transformer Engine attention backend" in megatron


@pytest.mark.parametrize("kernel, head_dim, padded", [
    ("fa2", 80, 96), ("fa2", 112, 128), ("fa2", 160, 160), ("fa2", 176, 192), ("fa2", 64, 64), ("fa2", 128, 128),
    ("fa3", 48, 64), ("fa3", 112, 128), ("fa1", 80, 128), ("fa_triton", 80, 128), ("fa_triton", 112, 128),
    ("fa_triton", 8, 16), ("cudnn", 112, 112)])
def test_a_flash_kernel_runs_a_head_on_its_compiled_width(kernel, head_dim, padded):
    """flash-attn's HEADDIM_SWITCH (v2), round_up_headdim (v3) and fmha_api (v1), Triton's next power of two: a head
    narrower than the kernel's tile runs the tile's matmuls, so its useful FLOP rate is head_dim / padded of the
    padded head's; cuDNN is priced unpadded."""
    assert float(compute.kernel_head_dim(kernel, head_dim)) == padded
    profile = H100 if kernel == "fa3" else A100                     # FlashAttention-3 runs on Hopper only
    padded_rate = float(compute.attention_efficiency(profile, 8192, 8192, padded, kernel, "fwd"))
    assert float(compute.attention_efficiency(profile, 8192, 8192, head_dim, kernel, "fwd")) == pytest.approx(
        padded_rate * head_dim / padded)
