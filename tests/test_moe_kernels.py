"""MoE-layer cost terms (costmodels/moe_kernels.py): the grouped expert-GEMM roofline and its fit to DeepGEMM, the fp32
weight-gradient accumulation, token permutation and router bytes, each against hand math or its source."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from costmodels import compute, moe_kernels
from costmodels.errors import InputError
from costmodels.hardware import load_profile
from costmodels.plan import Plan, PlanArrays, Recompute, RecomputeModule
from costmodels.specs import ClusterSpec, ExpertGemm, MlpKind, ModelSpec, MoESpec, TrainingSpec

H100 = load_profile("h100-80gb")
A100 = load_profile("a100-80gb")
# Mixtral-8x22B shapes
MIXTRAL = ModelSpec(name="mixtral-like", hidden_size=6144, num_layers=8, num_attention_heads=48, num_kv_heads=8,
                    ffn_hidden_size=16384, vocab_size=32000, mlp=MlpKind.GATED,
                    moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=16384))


def test_every_bundled_profile_has_the_grouped_curve():
    for name in ("a100-80gb", "a100-40gb", "h100-80gb", "h200-141gb", "b200-180gb"):
        profile = load_profile(name)
        assert moe_kernels.has_grouped_curve(profile), name
        assert moe_kernels.has_grouped_curve(profile, "fp8") == profile.supports("fp8"), name
        assert 0.0 < profile.gemm_efficiency["grouped_hbm_efficiency"] <= 1.0
        assert "compute.gemm_efficiency.grouped" in profile.provenance


def test_grouped_bytes_hand_computed():
    # 4 experts of 256×7168·7168×4096 in fp8: DeepGEMM's own count 4·(m·k + k·n + 2·m·n)
    m, n, k = 256.0, 4096.0, 7168.0
    flops = 4 * 2 * m * n * k
    assert moe_kernels.grouped_gemm_bytes(flops, m, n, k, "fp8") == pytest.approx(4 * (m * k + k * n + 2 * m * n))
    assert moe_kernels.grouped_gemm_bytes(flops, m, n, k, "bf16") == pytest.approx(4 * 2 * (m * k + k * n + m * n))


def test_grouped_time_is_compute_plus_traffic():
    m, n, k, groups = 512.0, 3072.0, 4096.0, 16
    flops = groups * 2 * m * n * k
    params = H100.gemm_efficiency
    expected = flops / (989e12 * params["peak_fraction"]) \
        + groups * 2 * (m * k + k * n + m * n) / (3.35e12 * params["grouped_hbm_efficiency"])
    assert moe_kernels.grouped_gemm_time_s(H100, flops, m, n, k, "bf16") == pytest.approx(expected, rel=1e-6)


def test_grouped_efficiency_rises_with_tokens_per_expert():
    # same total FLOPs spread over fewer, fuller experts: every expert's weights are read once, so fewer is faster
    n, k, total_tokens = 3072.0, 4096.0, 8192.0
    times = []
    for groups in (64, 32, 16, 8, 4, 1):
        m = total_tokens / groups
        times.append(float(moe_kernels.grouped_gemm_time_s(H100, groups * 2 * m * n * k, m, n, k, "bf16")))
    assert all(a > b for a, b in zip(times, times[1:]))
    # at small m the operand traffic dominates (over twice the compute-bound time); at large m the tensor cores do
    # (within ~15% of it)
    peak = H100.peak_flops_per_s["bf16"] * moe_kernels.grouped_compute_fraction(H100, "bf16")
    small = moe_kernels.grouped_gemm_time_s(H100, 2 * 128 * n * k, 128.0, n, k, "bf16")
    assert small > 2.0 * (2 * 128 * n * k / peak)
    large = moe_kernels.grouped_gemm_time_s(H100, 2 * 8192 * n * k, 8192.0, n, k, "bf16")
    assert 2 * 8192 * n * k / peak < large < 1.25 * (2 * 8192 * n * k / peak)


def test_grouped_fit_reproduces_the_deepgemm_tables():
    """The fitted roofline against every grouped row of DeepGEMM (H800 = H100 compute and HBM): within 25%."""
    try:
        from benchmarks import microbench_tables as tables
        rows = tables.all_rows()["gemm_fp8_deepgemm_h800.csv"]
    except (ImportError, FileNotFoundError):
        pytest.skip("shared/reference is not next to this checkout")
    grouped = [row.measurement for row in rows if row.measurement.kind == "grouped_gemm"]
    assert len(grouped) >= 8
    for row in grouped:
        predicted = float(moe_kernels.grouped_gemm_time_s(H100, np.array(row.flops), row.m, row.n, row.k, "fp8"))
        assert predicted == pytest.approx(row.timing.median_s, rel=0.25), row.label


def test_fit_grouped_gemm_recovers_known_parameters():
    from autopar.calibrate.fit import fit_grouped_gemm
    from autopar.calibrate.measurements import GemmMeasurement, Timing

    truth = dataclasses.replace(H100, gemm_efficiency={**H100.gemm_efficiency, "grouped_peak_fraction": 0.7,
                                                       "grouped_hbm_efficiency": 0.6})
    rows = []
    for m in (128, 256, 512, 1024, 4096):
        for n, k in ((4096, 7168), (7168, 2048)):
            seconds = float(moe_kernels.grouped_gemm_time_s(truth, np.array(2.0 * m * n * k), m, n, k, "fp8"))
            rows.append(GemmMeasurement("fp8", m, n, k, Timing(seconds, seconds, seconds, 1), kind="grouped_gemm"))
    fit = fit_grouped_gemm(rows, H100)
    assert fit.params["grouped_peak_fraction"] == pytest.approx(0.7, rel=1e-3)
    assert fit.params["grouped_hbm_efficiency"] == pytest.approx(0.6, rel=1e-3)


def test_fit_grouped_gemm_fits_the_bf16_limit_and_holds_hbm_where_every_row_is_compute_bound():
    """bf16 rows of thousands of rows per group (torchao's B200 table): the fit finds their compute limit, and leaves
    the HBM fraction, which they do not determine, at the base's value (fit.GROUPED_HBM_FROM_SHARE)."""
    from autopar.calibrate.fit import fit_grouped_gemm
    from autopar.calibrate.measurements import GemmMeasurement, Timing

    def with_truth(hbm_fraction: float):
        return dataclasses.replace(H100, gemm_efficiency={**H100.gemm_efficiency, "grouped_bf16_peak_fraction": 0.4,
                                                          "grouped_hbm_efficiency": hbm_fraction})
    truth = with_truth(H100.gemm_efficiency["grouped_hbm_efficiency"])
    rows = []
    for m in (4096, 8192, 16384):
        for n, k in ((8192, 5120), (2048, 7168)):
            seconds = float(moe_kernels.grouped_gemm_time_s(truth, np.array(2.0 * m * n * k), m, n, k, "bf16"))
            rows.append(GemmMeasurement("bf16", m, n, k, Timing(seconds, seconds, seconds, 1), kind="grouped_gemm"))
    fit = fit_grouped_gemm(rows, H100)
    assert set(fit.params) == {moe_kernels.GROUPED_BF16_PEAK_FRACTION}     # the HBM fraction is held
    assert fit.params[moe_kernels.GROUPED_BF16_PEAK_FRACTION] == pytest.approx(0.4, rel=1e-3)
    # memory-bound rows (small m) do determine it: fitted with the limit
    truth = with_truth(0.3)
    small = [GemmMeasurement("bf16", m, 8192, 5120, Timing(s, s, s, 1), kind="grouped_gemm")
             for m in (16, 32, 64, 4096, 8192)
             for s in [float(moe_kernels.grouped_gemm_time_s(truth, np.array(2.0 * m * 8192 * 5120), m, 8192, 5120,
                                                             "bf16"))]]
    both = fit_grouped_gemm(small, H100)
    assert both.params["grouped_hbm_efficiency"] == pytest.approx(0.3, rel=1e-3)
    assert both.params[moe_kernels.GROUPED_BF16_PEAK_FRACTION] == pytest.approx(0.4, rel=1e-3)


def test_b200_bf16_grouped_gemms_take_torchaos_measured_limit_not_the_dense_one(microbench_tables):
    """torch._grouped_mm in bf16 on B200 (benchmarks/microbench/grouped_mm_bf16_b200_torchao.csv): one timed call is
    forward + dA + dB, 3·G group GEMMs, after the harness's MSE loss (5 passes over the bf16 output at 8 TB/s).
    The fitted limit sits far under cuBLAS's dense 0.80, GB200 (same die) takes it, and expert_gemm=grouped is
    priced with it while expert_gemm=cublas keeps the dense curve."""
    tables = microbench_tables
    table = next(t for t in tables.TABLES if t.file == "grouped_mm_bf16_b200_torchao.csv")
    assert table.in_repository and tables.table_path(table).is_file()
    first = next(iter(table.read(tables.table_path(table))))
    # first row: total_M 128000, N 8192, K 5120, G 1, 43140.20 µs
    loss_s = 5 * 128000 * 8192 * 2 / 8.0e12
    assert first.profiles == tables.B200
    assert (first.measurement.m, first.measurement.n, first.measurement.k) == (128000, 8192, 5120)
    assert first.measurement.timing.median_s == pytest.approx((43140.20e-6 - loss_s) / 3)
    b200, gb200 = load_profile("b200-180gb"), load_profile("gb200-186gb")
    limit = b200.gemm_efficiency[moe_kernels.GROUPED_BF16_PEAK_FRACTION]
    assert 0.3 < limit < 0.5 < b200.gemm_efficiency["peak_fraction"]
    assert gb200.gemm_efficiency[moe_kernels.GROUPED_BF16_PEAK_FRACTION] == limit
    assert moe_kernels.grouped_compute_fraction(b200, "bf16") == limit
    assert moe_kernels.grouped_compute_fraction(H100, "bf16") == H100.gemm_efficiency["peak_fraction"]
    assert "grouped_mm_bf16_b200_torchao.csv" in b200.provenance["compute.gemm_efficiency.grouped"]


def test_wgrad_accumulation_bytes_hand_computed():
    # 8 experts, fc1 6144 -> 4096: 8 · 6144 · 4096 weights, 6 extra bytes each (fp32 read + write vs a bf16 write)
    m, n, k = 1024.0, 4096.0, 6144.0
    flops = 8 * 2 * m * n * k
    assert moe_kernels.grouped_wgrad_accumulation_bytes(flops, m, n, k) == pytest.approx(8 * 6144 * 4096 * 6)


def test_token_permutation_bytes_hand_computed():
    # 2048 tokens × top-2 sent, 4096 copies received, h = 6144 bf16: permute 2 + unpermute 3 passes over the sent
    # copies, and sort_chunks 2 × 2 over the received ones when the GPU holds several experts behind EP > 1
    sent, received, h = 4096.0, 4096.0, 6144
    row = h * 2.0
    both = moe_kernels.token_permutation_bytes(np.array([sent]), np.array([received]), h, np.array([True]))
    assert both[0] == pytest.approx(5 * sent * row + 4 * received * row)
    alone = moe_kernels.token_permutation_bytes(np.array([sent]), np.array([received]), h, np.array([False]))
    assert alone[0] == pytest.approx(5 * sent * row)


def test_torchtitan_token_movement_hand_computed():
    """torchtitan's own copies (moe_kernels module docstring), per copy element of h = 2048: the gather in expert
    order 4, the padded groups around the experts 3 x 4 on the received copies, the unsort's zeros 2 (every routed
    token's top_k slots) and index assignment 4, the weighted sum in fp32 10 (plus 10 per token element); weights
    applied first instead: the eager fp32 round trip 20 and a bf16 sum (2 per copy, 2 per token); DeepEP: index_select
    4, the weight multiply 4 and scatter_add 6 per received copy, zeros 2 per distinct received token. Under TP with
    etp 1 a rank sends its quarter of the copies but unsorts and sums every token's."""
    h, tokens, top_k = 2048, 1000.0, 8
    t = np.array([tokens])
    sent = received = t * top_k
    distinct = t * 5.3

    def movement(sent, weights_first=False, deepep=False):
        return moe_kernels.torchtitan_token_movement_bytes(sent, t, received * sent / (t * top_k), distinct, h, top_k,
                                                           weights_first=weights_first, deepep=deepep)[0]

    assert movement(sent) == pytest.approx(h * ((4 + 12 + 2 + 4 + 10) * tokens * top_k + 10 * tokens))
    assert movement(sent, weights_first=True) == pytest.approx(
        h * ((4 + 20 + 12 + 2 + 4 + 2) * tokens * top_k + 2 * tokens))
    assert movement(sent, deepep=True) == pytest.approx(h * (14 * tokens * top_k + 2 * tokens * 5.3))
    quarter = movement(sent / 4)
    assert quarter == pytest.approx(h * ((4 + 12 + 4) * tokens * top_k / 4 + (2 + 10) * tokens * top_k + 10 * tokens))


def test_the_engine_chooses_the_token_movement_and_the_activation_kernels():
    """The same plan: Megatron-Core's permutation (5 passes over the sent copies, 4 over the received ones) and its
    fused SwiGLU (6 bytes a column); torchtitan's own copies; eager PyTorch's SiLU and multiply as two kernels (10
    bytes a column), fused again when compiled."""
    from costmodels.specs import Engine, LaunchPath

    fine = dataclasses.replace(MIXTRAL, moe=MoESpec(num_experts=64, top_k=8, expert_ffn_hidden_size=2048))
    plans = PlanArrays.from_plans([Plan(tp=1, ep=8, etp=1)])
    megatron = TrainingSpec(seq_len=4096, global_batch_size=256)
    titan = dataclasses.replace(megatron, engine=Engine.TORCHTITAN)
    compiled = dataclasses.replace(titan, launch=LaunchPath.COMPILE)
    assert compute.moe_dispatch_bytes(fine, titan, plans)[0] > 1.5 * compute.moe_dispatch_bytes(fine, megatron,
                                                                                                 plans)[0]
    megatron_act = compute.routed_expert_activation_bytes(fine, megatron, plans)[0]
    assert compute.routed_expert_activation_bytes(fine, titan, plans)[0] == pytest.approx(megatron_act * 10 / 6)
    assert compute.routed_expert_activation_bytes(fine, compiled, plans)[0] == pytest.approx(megatron_act)


def test_megatron_core_under_deepep_permutes_only_the_received_copies():
    """The flex dispatcher hands DeepEP the tokens unpermuted: permute + unpermute (5 passes) of the copies a rank
    receives and no chunk sort, where the alltoall dispatcher permutes the sent copies and sorts the received."""
    fine = dataclasses.replace(MIXTRAL, moe=MoESpec(num_experts=64, top_k=8, expert_ffn_hidden_size=2048))
    plans = PlanArrays.from_plans([Plan(tp=1, ep=8, etp=1)])
    alltoall = TrainingSpec(seq_len=4096, global_batch_size=256)
    deepep = dataclasses.replace(alltoall, moe_dispatcher="deepep")
    copies, row, router = 4096.0 * 8, 6144 * 2.0, 6 * 4 * 4096 * 64
    assert compute.moe_dispatch_bytes(fine, alltoall, plans)[0] == pytest.approx(9 * copies * row + router)
    assert compute.moe_dispatch_bytes(fine, deepep, plans)[0] == pytest.approx(5 * copies * row + router)


def test_router_bytes_hand_computed():
    assert moe_kernels.router_bytes(np.array([1000.0]), 128)[0] == pytest.approx(6 * 4 * 1000 * 128)


def test_dispatch_bytes_follow_the_plan():
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    fine = dataclasses.replace(MIXTRAL, moe=MoESpec(num_experts=64, top_k=8, expert_ffn_hidden_size=2048))
    plans = PlanArrays.from_plans([Plan(tp=2, ep=8, etp=1, sp=True), Plan(tp=2, ep=1, etp=1, sp=True)])
    local, h = 4096 / 2, 6144                       # sequence-parallel tokens of one GPU
    row = h * 2.0
    # 8 experts on EP 8: one local expert, no sort_chunks; EP 1: no all-to-all, but all 8 experts are local, and
    # Megatron-Core sorts the chunks whenever a rank holds more than one (token_dispatcher.py dispatch_postprocess,
    # combine_preprocess: `if self.num_local_experts > 1`), at any EP size
    got = compute.moe_dispatch_bytes(MIXTRAL, training, plans)
    single = 5 * local * 2 * row + 6 * 4 * local * 8
    assert got[0] == pytest.approx(single)
    assert got[1] == pytest.approx(single + 4 * local * 2 * row)
    # 64 experts on EP 8: 8 local experts, the received copies are regrouped after dispatch and back before combine
    got = compute.moe_dispatch_bytes(fine, training, plans)
    received = float(compute.moe_tokens_per_local_expert(fine, training, plans)[0]) * 8
    assert received == pytest.approx(local * 8)     # balanced routing: a GPU receives what it sends
    assert got[0] == pytest.approx(5 * local * 8 * row + 4 * received * row + 6 * 4 * local * 64)
    assert got[1] == pytest.approx(5 * local * 8 * row + 4 * local * 8 * row + 6 * 4 * local * 64)


def test_padding_to_capacity_runs_every_expert_at_its_capacity_whatever_the_imbalance():
    """--moe-pad-expert-input-to-capacity: Megatron-Core's drop-and-pad gives every expert exactly its capacity rows
    (moe_utils.apply_router_token_dropping: final_map = capacity_mask; token_dispatcher.py preprocess: num_out_tokens
    = capacity * num_experts), so the expert GEMMs, the activation and the sender's permuted rows are c times the
    balanced load even at imbalance 1; without padding an imbalance loads the receivers, not the sender."""
    plans = PlanArrays.from_plans([Plan(tp=1, ep=8, etp=1)])
    balanced = TrainingSpec(seq_len=4096, global_batch_size=256)
    capped = dataclasses.replace(balanced, moe_capacity_factor=1.5)
    padded = dataclasses.replace(capped, moe_pad_to_capacity=True)
    assert compute.moe_load_factor(capped) == 1.0 and compute.moe_load_factor(padded) == 1.5
    experts = [g for g in compute.moe_mlp_gemms(MIXTRAL, padded, plans) if g.grouped]
    balanced_experts = [g for g in compute.moe_mlp_gemms(MIXTRAL, balanced, plans) if g.grouped]
    assert experts[0].flops[0] == pytest.approx(1.5 * balanced_experts[0].flops[0])
    assert compute.routed_expert_activation_bytes(MIXTRAL, padded, plans)[0] == pytest.approx(
        1.5 * compute.routed_expert_activation_bytes(MIXTRAL, balanced, plans)[0])
    tokens, row = 4096.0, 6144 * 2.0                # h 6144, top 2, one local expert on EP 8, tp 1: no SP split
    router = 6 * 4 * tokens * 8
    assert compute.moe_dispatch_bytes(MIXTRAL, padded, plans)[0] == pytest.approx(5 * 1.5 * tokens * 2 * row + router)
    imbalanced = dataclasses.replace(balanced, moe_imbalance_factor=1.3)
    assert compute.moe_dispatch_bytes(MIXTRAL, imbalanced, plans)[0] == pytest.approx(5 * tokens * 2 * row + router)
    # the experts' stored activations hold the padded rows too
    from costmodels.evaluate import evaluate
    stored = [evaluate(MIXTRAL, ClusterSpec(profile=H100, num_gpus=8), t, plans).memory_terms_bytes[
        "expert_mlp_activations"][0] for t in (balanced, padded)]
    assert stored[1] == pytest.approx(1.5 * stored[0])


def test_moe_layer_prices_grouped_experts_and_wgrad_accumulation():
    training = TrainingSpec(seq_len=4096, global_batch_size=256, expert_gemm="grouped")
    plans = PlanArrays.from_plans([Plan(tp=2, ep=8, etp=1, sp=True)])
    with_curve = compute.layer_times_s(MIXTRAL, H100, training, plans)
    params = {k: v for k, v in H100.gemm_efficiency.items() if k not in moe_kernels.GROUPED_PARAMETERS}
    assert not moe_kernels.has_grouped_curve(dataclasses.replace(H100, gemm_efficiency=params))
    dense_curve = dataclasses.replace(H100, gemm_efficiency=params)
    without = compute.layer_times_s(MIXTRAL, dense_curve, training, plans)
    # the routed experts' GEMMs, and only they, move from the dense curve to the grouped roofline (both at the
    # step's sustained clock)
    gemms = compute.moe_mlp_gemms(MIXTRAL, training, plans)
    moved_s = sum(moe_kernels.grouped_gemm_time_s(H100, g.flops, g.m, g.n, g.k, "bf16", H100.sustained_clock_fraction)
                  - compute.sustained_compute_s(H100, compute.gemm_time_s(H100, g.flops, g.m, g.n, g.k, "bf16"))
                  for g in gemms if g.grouped)
    assert with_curve.moe_layer_fwd_s[0] - without.moe_layer_fwd_s[0] == pytest.approx(float(moved_s[0]))
    assert float(moved_s[0]) != 0.0
    assert with_curve.dense_layer_fwd_s[0] == pytest.approx(without.dense_layer_fwd_s[0])
    assert np.all(with_curve.moe_layer_bwd_extra_s > without.moe_layer_bwd_extra_s)   # fp32 main_grad traffic
    # the extra backward is the accumulation less one forward of the dispatch copies
    accumulation = sum(moe_kernels.grouped_wgrad_accumulation_bytes(g.flops, g.m, g.n, g.k) for g in gemms
                       if g.grouped) / moe_kernels.grouped_hbm_bytes_per_s(H100)
    dispatch = compute.moe_dispatch_bytes(MIXTRAL, training, plans) / H100.hbm_bandwidth_bytes_per_s
    assert with_curve.moe_layer_bwd_extra_s[0] == pytest.approx(float(accumulation[0] - dispatch[0]))


def test_per_expert_cublas_gemms_take_the_dense_curve_and_one_grouped_kernel_the_roofline():
    # Megatron-Core with Transformer Engine (the default): GroupedLinear is a cuBLAS GEMM per expert, so the routed
    # experts cost what they cost on a profile without the grouped curve; torchtitan's torch._grouped_mm does not
    cublas = TrainingSpec(seq_len=4096, global_batch_size=256)
    assert cublas.expert_gemm is ExpertGemm.CUBLAS
    grouped = dataclasses.replace(cublas, expert_gemm=ExpertGemm.GROUPED)
    plans = PlanArrays.from_plans([Plan(tp=2, ep=8, etp=1, sp=True), Plan(tp=1, ep=8, etp=1)])
    params = {k: v for k, v in H100.gemm_efficiency.items() if k not in moe_kernels.GROUPED_PARAMETERS}
    no_grouped_curve = dataclasses.replace(H100, gemm_efficiency=params)
    per_expert = compute.layer_times_s(MIXTRAL, H100, cublas, plans)
    dense = compute.layer_times_s(MIXTRAL, no_grouped_curve, grouped, plans)
    one_kernel = compute.layer_times_s(MIXTRAL, H100, grouped, plans)
    assert per_expert.moe_layer_fwd_s == pytest.approx(dense.moe_layer_fwd_s)
    assert not np.allclose(one_kernel.moe_layer_fwd_s, per_expert.moe_layer_fwd_s)
    assert per_expert.dense_layer_fwd_s == pytest.approx(one_kernel.dense_layer_fwd_s)
    # the grouped roofline adds its fp32 main_grad traffic; a cuBLAS GEMM per expert accumulates like a dense
    # Linear's wgrad GEMM, on the dense curve: its backward extra is only the single pass of the dispatch copies
    dispatch = compute.moe_dispatch_bytes(MIXTRAL, cublas, plans) / H100.hbm_bandwidth_bytes_per_s
    assert per_expert.moe_layer_bwd_extra_s == pytest.approx(-dispatch)
    assert np.all(one_kernel.moe_layer_bwd_extra_s > per_expert.moe_layer_bwd_extra_s)
    with pytest.raises(InputError, match="expert_gemm: unknown expert GEMM kernel 'fused'; use cublas, grouped"):
        TrainingSpec(expert_gemm="fused")


def test_smaller_expert_batches_cost_more_per_flop():
    # Qwen3-235B-like experts: the same tokens on EP 32 (4 experts a GPU) vs EP 8 (16): per FLOP, EP 8 is dearer
    model = ModelSpec(name="qwen3-like", hidden_size=4096, num_layers=4, num_attention_heads=64, num_kv_heads=4,
                      ffn_hidden_size=12288, vocab_size=151936, mlp=MlpKind.GATED,
                      moe=MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=1536))
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    plans = PlanArrays.from_plans([Plan(tp=2, ep=32, etp=1, sp=True), Plan(tp=2, ep=8, etp=1, sp=True)])
    gemms = [g for g in compute.moe_mlp_gemms(model, training, plans) if g.grouped]
    seconds = sum(moe_kernels.grouped_gemm_time_s(H100, g.flops, g.m, g.n, g.k, "bf16") for g in gemms)
    flops = sum(g.flops for g in gemms)
    per_flop = seconds / flops
    assert per_flop[1] > 1.1 * per_flop[0]


def test_expert_tp_collectives_are_not_hidden_by_tp_comm_overlap():
    """The dispatcher's all-gather / reduce-scatter over the expert-TP group are plain NCCL calls: --tp-comm-overlap
    hides the dense blocks' SP collectives behind the GEMMs (userbuffers), never these."""
    from costmodels import steptime
    from costmodels.specs import ClusterSpec

    # a profile without an SM count: Transformer Engine's userbuffer SM margin (steptime.tp_overlap_sm_margin_s,
    # tested on its own) would swamp these collectives next to the endless GEMMs below
    cluster = ClusterSpec(profile=dataclasses.replace(H100, streaming_multiprocessors=0), num_gpus=64)
    overlap = TrainingSpec(seq_len=4096, global_batch_size=256, tp_comm_overlap=True)
    plans = PlanArrays.from_plans([Plan(tp=2, ep=8, etp=2, sp=True, pp=1)])
    stage = np.zeros(1, dtype=int)
    endless = np.array([1e9])
    gemms = compute.TpOverlapGemms(endless, endless, endless, endless, endless, endless)
    hidden = steptime.tp_comm_s(MIXTRAL, cluster, overlap, plans, stage, gemms)
    exposed = steptime.tp_comm_s(MIXTRAL, cluster, dataclasses.replace(overlap, tp_comm_overlap=False), plans, stage)
    layers = MIXTRAL.num_layers
    activation_bytes = 4096 * 6144 * 2.0
    placement = steptime.tp_group(plans, 8)

    def block_s(group, bytes_):
        return steptime.group_collective_time_s(H100, group, "all_gather", bytes_) \
            + steptime.group_collective_time_s(H100, group, "reduce_scatter", bytes_)

    dense = 2.0 * layers * block_s(placement, activation_bytes)                 # attention blocks (MoE every layer)
    expert = 2.0 * layers * steptime.expert_tp_block_s(MIXTRAL, cluster, overlap, plans, block_s, activation_bytes)
    assert exposed[0] == pytest.approx(float(dense[0] + expert[0]))
    # with overlap and endless GEMM time: of the attention blocks only the ring-exchanged collectives' first chunk
    # (1/tp: the forward's gather and scatter, the backward's gather; the bulk scatter hides whole), the expert
    # blocks in full
    gather = steptime.group_collective_time_s(H100, placement, "all_gather", activation_bytes)
    first_chunks = layers * (block_s(placement, activation_bytes) + gather) / 2.0
    assert hidden[0] == pytest.approx(float(first_chunks[0] + expert[0]))


def test_deepep_internode_rows_give_the_ib_all_to_all_points():
    """DeepEP's internode dispatch/combine bandwidths (same CX7 NIC as DGX H100) reproduced by the fitted points."""
    try:
        from benchmarks import microbench_tables as tables
        rows = [row for row in tables.all_rows()["moe_deepep_v1_dispatch_combine_h800.csv"]
                if row.profiles == tables.H100]      # the H800 rows of the same file feed h800-80gb
    except (ImportError, FileNotFoundError):
        pytest.skip("shared/reference is not next to this checkout")
    from autopar.calibrate.fit import predict_collective_s

    assert len(rows) == 12                          # 2 README versions × EP 16/32/64 × dispatch, combine
    for row in rows:
        m = row.measurement
        assert (m.link, m.kind, m.ranks_per_node) == ("ib", "all_to_all", 8)
        if row.role == "fit":
            assert predict_collective_s(H100, m) == pytest.approx(m.timing.median_s, rel=0.05)
        elif m.group_size == 16:                    # 2 nodes: not NIC-bound, the model (4-node point) runs faster
            assert predict_collective_s(H100, m) < m.timing.median_s
    assert sum(row.role == "fit" for row in rows) == 4   # the current figures on 4 and 8 nodes
    points = {p.group_size: p for p in H100.collectives["ib"]["all_to_all"]}
    assert set(points) == {4, 8}
    # the rows DeepEP puts on the wire, its own node's left out: 0.75-0.9 of the ~50 GB/s NIC (DeepEP's printed
    # 'RDMA bandwidth' counts the own node's rows too, and reads up to 58 GB/s)
    for point in points.values():
        assert 0.8 * 50e9 <= point.bus_bandwidth_bytes_per_s <= 0.9 * 50e9


def test_routed_expert_activation_is_priced_on_its_own_bytes():
    """The experts' fused SwiGLU reads the fc1 output and writes its own (6 bytes a gated column) at HBM bandwidth:
    outside the fitted elementwise factor, and the same seconds its selective recompute (moe_act) re-runs."""
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    plans = PlanArrays.from_plans([Plan(tp=2, ep=8, etp=1, sp=True), Plan(tp=2, ep=4, etp=2, sp=True)])
    received = compute.moe_tokens_per_local_expert(MIXTRAL, training, plans) * MIXTRAL.moe.num_experts / plans.ep
    expected = received * 6.0 * MIXTRAL.moe.expert_ffn_hidden_size / plans.etp
    activation = compute.routed_expert_activation_bytes(MIXTRAL, training, plans)
    assert activation == pytest.approx(expected)
    # not among the bytes the fitted factor scales: an MoE layer's factor bytes are the dense layer's less its MLP
    moe_bytes, _ = compute.elementwise_bytes_per_layer(MIXTRAL, training, plans, moe_layer=True)
    dense_bytes, _ = compute.elementwise_bytes_per_layer(MIXTRAL, training, plans, moe_layer=False)
    tokens = 4096.0
    dense_mlp = tokens * 6.0 * MIXTRAL.ffn_hidden_size / plans.tp
    assert moe_bytes == pytest.approx(dense_bytes - dense_mlp)
    # the factor does not touch it: a profile with twice the factor moves the MoE layer by the factor bytes only
    section = dict(H100.extra.get("elementwise", {}))
    doubled = dataclasses.replace(H100, extra={**H100.extra, "elementwise": {
        **section, "traffic_per_activation_byte": 2 * section["traffic_per_activation_byte"]}})
    base = compute.layer_times_s(MIXTRAL, H100, training, plans)
    more = compute.layer_times_s(MIXTRAL, doubled, training, plans)
    factor_s = moe_bytes * section["traffic_per_activation_byte"] / H100.hbm_bandwidth_bytes_per_s
    assert more.moe_layer_fwd_s - base.moe_layer_fwd_s == pytest.approx(factor_s)
    # its recompute re-runs exactly these bytes
    act = dataclasses.replace(plans, recompute=np.full(2, int(Recompute.SELECTIVE)),
                              recompute_modules=np.full(2, int(RecomputeModule.MOE_ACT)))
    _, moe_sel = compute.selective_recompute_s(MIXTRAL, H100, training, act, np.zeros(2))
    assert moe_sel == pytest.approx(activation / H100.hbm_bandwidth_bytes_per_s)


def test_torchtitan_moe_under_tp_routes_replicated_tokens():
    """torchtitan (models/llama4/infra/parallelize.py apply_moe_ep_tp): a MoE layer's input is all-gathered over TP
    and its router runs on every token of the micro-batch on every TP rank; with expert TP (etp = tp) each TP rank
    then permutes and sends all of them and the routed input's gradient is all-reduced over TP in the backward
    (ExpertTensorParallel); with etp 1 the tokens are split over TP again before the dispatch, as Megatron-Core's
    sequence-parallel dispatch does. Hand-computed against the Megatron-Core pricing of the same plans."""
    from costmodels import steptime
    from costmodels.specs import ClusterSpec, Engine

    cluster = ClusterSpec(profile=H100, num_gpus=64)
    megatron = TrainingSpec(seq_len=4096, global_batch_size=256)
    titan = dataclasses.replace(megatron, engine=Engine.TORCHTITAN)
    etp, folded = Plan(tp=4, ep=2, etp=4, sp=True), Plan(tp=4, ep=8, etp=1, sp=True)
    plans = PlanArrays.from_plans([etp, folded])
    a2a_titan = steptime.ep_all_to_all_one_s(MIXTRAL, cluster, titan, plans)
    a2a_megatron = steptime.ep_all_to_all_one_s(MIXTRAL, cluster, megatron, plans)
    tokens, h, top_k = 4096.0, 6144, 2
    ep2 = steptime.ep_group(plans, 8)
    every_token = steptime.group_collective_time_s(H100, ep2, "all_to_all", tokens * top_k * h * 2.0)
    assert a2a_titan[0] == pytest.approx(float(every_token[0]))                  # all the micro-batch's tokens
    assert a2a_megatron[0] == pytest.approx(float(steptime.group_collective_time_s(
        H100, ep2, "all_to_all", tokens / 4 * top_k * h * 2.0)[0]))              # the 1/tp sequence-parallel share
    assert a2a_titan[1] == pytest.approx(float(a2a_megatron[1]))                # etp 1: split over TP again

    # router on every token for both torchtitan plans; per element of a copy: the gather 4, vstack + padded gather
    # + scatter back 12 and the unsort's index assignment 4 on the copies a rank sends (all tokens' only with expert
    # TP), the unsort buffer's zeros 2 and the fp32 weighted sum 10 (and 10 per token) on every token it routed
    row = h * 2.0
    got = compute.moe_dispatch_bytes(MIXTRAL, titan, plans)
    router = 6 * 4 * tokens * 8
    every = (2 + 10) * tokens * top_k + 10 * tokens
    assert got[0] == pytest.approx(h * ((4 + 12 + 4) * tokens * top_k + every) + router)
    assert got[1] == pytest.approx(h * ((4 + 12 + 4) * tokens / 4 * top_k + every) + router)
    assert float(compute.moe_dispatch_bytes(MIXTRAL, megatron, plans)[1]) == pytest.approx(
        5 * tokens / 4 * top_k * row + 6 * 4 * tokens / 4 * 8)

    # the routed input's gradient all-reduce: only torchtitan with expert TP, top_k copies of every token
    reduce = steptime.routed_input_grad_reduce_s(MIXTRAL, cluster, titan, plans)
    tp4 = steptime.tp_group(plans, 8)
    assert reduce[0] == pytest.approx(float(steptime.group_collective_time_s(
        H100, tp4, "all_reduce", tokens * top_k * h * 2.0)[0]))
    assert reduce[1] == 0.0
    assert not steptime.routed_input_grad_reduce_s(MIXTRAL, cluster, megatron, plans).any()
    # and a MoE layer's TP collectives: the input's all-gather and the output's reduce-scatter (a TP block), not
    # Megatron-Core's expert-TP gather of top_k copies
    tp_block, etp_block = steptime.tp_block_s(MIXTRAL, cluster, titan, plans)[:2]
    np.testing.assert_allclose(etp_block, tp_block)


def test_torchtitan_moe_layers_tp_collectives_are_one_block_shared_experts_inside():
    """Under torchtitan a MoE layer's TP traffic is the MoE block's input all-gather and output reduce-scatter (its
    shared experts run on that gathered input, ColwiseParallel/RowwiseParallel with Partial output), plus expert
    TP's gradient all-reduce; Megatron-Core gives the shared expert its own TP block."""
    from costmodels import steptime
    from costmodels.specs import ClusterSpec, Engine

    cluster = ClusterSpec(profile=H100, num_gpus=64)
    shared = dataclasses.replace(MIXTRAL, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=16384,
                                                      num_shared_experts=1, shared_expert_ffn_hidden_size=16384))
    titan = TrainingSpec(seq_len=4096, global_batch_size=256, engine=Engine.TORCHTITAN)
    plans = PlanArrays.from_plans([Plan(tp=4, ep=2, etp=4, sp=True), Plan(tp=4, ep=8, etp=1, sp=True)])
    stage = np.zeros(2, dtype=int)
    tp_block = steptime.tp_block_s(shared, cluster, titan, plans)[0]
    layers = shared.num_layers                                        # every layer a MoE layer, no recompute
    expected = 2.0 * (layers + layers) * tp_block + layers * steptime.routed_input_grad_reduce_s(
        shared, cluster, titan, plans)
    np.testing.assert_allclose(steptime.tp_comm_s(shared, cluster, titan, plans, stage), expected)
    # Megatron-Core at etp 1: the attention and the shared expert's own TP blocks, the routed experts none
    megatron = dataclasses.replace(titan, engine=Engine.MEGATRON)
    assert steptime.tp_comm_s(shared, cluster, megatron, plans, stage)[1] == pytest.approx(
        2.0 * (layers + layers) * float(tp_block[1]))


def test_torchtitan_deepep_under_tp_dispatches_every_token_on_every_tp_rank():
    """DeepEPMoE has no reorderer, so ReordererSequenceParallel never splits its tokens over TP (etp 1): each TP rank
    dispatches the whole all-gathered input; the standard path splits them; Megatron-Core's flex dispatcher routes
    each rank's sequence-parallel share either way."""
    from costmodels import engines
    from costmodels.specs import Engine

    plans = PlanArrays.from_plans([Plan(tp=2, ep=8, etp=1, sp=True), Plan(tp=1, ep=8, etp=1)])
    titan = TrainingSpec(seq_len=4096, global_batch_size=256, engine=Engine.TORCHTITAN)
    assert engines.moe_dispatch_replicated(dataclasses.replace(titan, moe_dispatcher="deepep"), plans).tolist() == [
        True, False]
    assert not engines.moe_dispatch_replicated(titan, plans).any()
    assert not engines.moe_dispatch_replicated(TrainingSpec(seq_len=4096, global_batch_size=256,
                                                            moe_dispatcher="deepep"), plans).any()


def test_engines_that_keep_gate_and_up_apart_run_two_gemms_and_add_their_input_gradients():
    """Megatron-Core's linear_fc1 holds gate and up in one weight (one GEMM of 2F columns); torchtitan's
    GroupedExperts runs torch._grouped_mm once for w1 and once for w3 (models/moe/moe.py _run_experts_grouped_mm at
    v0.2.2), each reading the received copies, and its backward adds their two input gradients."""
    plans = PlanArrays.from_plans([Plan(tp=1, ep=8, etp=1)])
    megatron = TrainingSpec(seq_len=4096, global_batch_size=256, expert_gemm="grouped")
    titan = dataclasses.replace(megatron, engine="torchtitan")
    assert compute.gate_up_fused(megatron) and not compute.gate_up_fused(titan)
    fused = [g for g in compute.moe_mlp_gemms(MIXTRAL, megatron, plans) if g.grouped]
    split = [g for g in compute.moe_mlp_gemms(MIXTRAL, titan, plans) if g.grouped]
    assert len(fused) == 2 and len(split) == 3
    assert split[0].n[0] == split[1].n[0] == fused[0].n[0] / 2
    assert sum(g.flops[0] for g in split) == pytest.approx(sum(g.flops[0] for g in fused))
    # the grouped roofline reads the input once per GEMM: two GEMMs take longer than one of twice the width
    assert compute._gemms_time_s(H100, titan, split[:2])[0] > compute._gemms_time_s(H100, megatron, fused[:1])[0]
    rows = 4096 * 2                                 # tp 1: a GPU's 4096 tokens x top 2, one local expert
    added_s = compute.GRADIENT_ADD_BYTES_PER_ELEMENT * rows * 6144 / H100.hbm_bandwidth_bytes_per_s
    zero = np.zeros(1)
    assert compute.moe_backward_extra_s(H100, titan, split, zero)[0] - compute.moe_backward_extra_s(
        H100, megatron, split, zero)[0] == pytest.approx(added_s)
    dense = compute.mlp_gemms(MIXTRAL, np.array([4096.0]), 16384, np.array([1.0]), split_gate_up=True)
    assert [g.n[0] for g in dense] == [16384, 16384, 6144]
