"""Structure of the step-time model: hand-derived toy cases, topology, schedule properties, and term bookkeeping."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from costmodels import comm, compute, engines, pipeline, steptime
from costmodels.errors import InputError
from costmodels.hardware import LinkSpec, load_profile
from costmodels.params import padded_vocab_size
from costmodels.plan import PLAN_FIELDS, Plan, PlanArrays, Recompute
from costmodels.specs import ClusterSpec, MlpKind, MoESpec, ModelSpec, NormKind, PositionEmbedding, Precision, \
    TrainingSpec

H100 = load_profile("h100-80gb")
A100 = load_profile("a100-80gb")

LLAMA_7B = ModelSpec(name="llama-2-7b", hidden_size=4096, num_layers=32, num_attention_heads=32,
                     ffn_hidden_size=11008, vocab_size=32000)
LLAMA_70B = ModelSpec(name="llama-3.1-70b", hidden_size=8192, num_layers=80, num_attention_heads=64,
                      num_kv_heads=8, ffn_hidden_size=28672, vocab_size=128256)
MIXTRAL = ModelSpec(name="mixtral-8x7b", hidden_size=4096, num_layers=32, num_attention_heads=32, num_kv_heads=8,
                    ffn_hidden_size=14336, vocab_size=32000,
                    moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=14336))


def gpt(hidden: int, layers: int, heads: int) -> ModelSpec:
    return ModelSpec(name="gpt", hidden_size=hidden, num_layers=layers, num_attention_heads=heads,
                     ffn_hidden_size=4 * hidden, vocab_size=51200, mlp=MlpKind.PLAIN, norm=NormKind.LAYERNORM,
                     position_embedding=PositionEmbedding.LEARNED, max_position_embeddings=2048,
                     tied_embeddings=True, linear_bias=True)


def terms(model, num_gpus, plans, training=None, profile=H100, gpus_per_node=8):
    cluster = ClusterSpec(profile=profile, num_gpus=num_gpus, gpus_per_node=gpus_per_node)
    training = training or TrainingSpec(seq_len=4096, global_batch_size=256)
    return steptime.step_time_terms_s(model, cluster, training, PlanArrays.from_plans(plans))


# ---- alpha–beta and GEMM curve: hand arithmetic -----------------------------------------------------------------

def test_collective_time_alpha_beta_factors():
    link = LinkSpec(bandwidth_bytes_per_s=100e9, alpha_s=10e-6, nominal_bandwidth_bytes_per_s=100e9)
    # all-reduce of 1 GB over 4 ranks: 10 µs + 1e9 · 2·3/4 / 1e11 = 10 µs + 15 ms
    assert comm.collective_time_s(link, "all_reduce", 1e9, 4) == pytest.approx(0.01501)
    # all-gather / reduce-scatter / all-to-all: factor 3/4 → 7.5 ms + 10 µs
    for kind in ("all_gather", "reduce_scatter", "all_to_all"):
        assert comm.collective_time_s(link, kind, 1e9, 4) == pytest.approx(0.00751)
    # send/recv: factor 1 → 10 ms + 10 µs; a group of one costs nothing
    assert comm.collective_time_s(link, "send_recv", 1e9, 2) == pytest.approx(0.01001)
    assert comm.collective_time_s(link, "all_reduce", 1e9, 1) == 0.0


def test_elementwise_bytes_leave_out_dropout_masks_without_dropout():
    # h=64, s=16, b=1, tp=1, plain 4h MLP, MHA, unfused attention: replicated (8 + 2 masks)·T·h, split
    # (4q + 4kv)·T + 4F·T, scores (2 softmax + 1 mask + 2 dropout output)·a·s·T; without dropout 8·T·h and 2·a·s·T
    model = gpt(64, 2, 4)
    training = TrainingSpec(seq_len=16, global_batch_size=1, flash_attention=False)
    plans = PlanArrays.from_plans([Plan()])
    tokens, h, a = 16, 64, 4
    split = (4 * h + 4 * h) * tokens + 4 * 4 * h * tokens
    layer, scores = compute.elementwise_bytes_per_layer(model, training, plans, moe_layer=False)
    assert float(layer[0]) == pytest.approx(10 * tokens * h + split) and float(scores[0]) == 5 * a * 16 * tokens
    layer, scores = compute.elementwise_bytes_per_layer(dataclasses.replace(model, dropout=0.0), training, plans,
                                                        moe_layer=False)
    assert float(layer[0]) == pytest.approx(8 * tokens * h + split) and float(scores[0]) == 2 * a * 16 * tokens


def test_gemm_efficiency_curve_by_hand():
    # the plateau and roll-off alone (no kernel floor): a square GEMM of side half_saturation_dim runs at
    # peak_fraction / (1 + d/3 · 3/d) = peak_fraction / 2, monotone in every dimension and symmetric in (m, n, k)
    params = H100.gemm_efficiency
    plain = dataclasses.replace(H100, gemm_efficiency={k: v for k, v in params.items()
                                                       if k != compute.KERNEL_FLOOR_US})
    d = params["half_saturation_dim"]
    assert compute.gemm_efficiency(plain, d, d, d, "bf16") == pytest.approx(params["peak_fraction"] / 2)
    assert compute.gemm_efficiency(plain, 8192, 8192, 512) < compute.gemm_efficiency(plain, 8192, 8192, 4096)
    assert compute.gemm_efficiency(plain, 100, 2000, 30) == pytest.approx(
        compute.gemm_efficiency(plain, 30, 100, 2000))
    # with it, by hand at 1024³: the larger of the roll-off and the floor (smoothly, OVERHEAD_NORM), in units of the
    # plateau's time
    plateau_s = 2.0 * 1024**3 / (params["peak_fraction"] * H100.peak_flops_per_s["bf16"])
    floor, roll_off = params[compute.KERNEL_FLOOR_US] * 1e-6 / plateau_s, d / 1024
    assert floor > roll_off
    overhead = (floor ** compute.OVERHEAD_NORM + roll_off ** compute.OVERHEAD_NORM) ** (1 / compute.OVERHEAD_NORM)
    assert float(compute.gemm_efficiency(H100, 1024, 1024, 1024)) == pytest.approx(
        params["peak_fraction"] / (1 + overhead))
    # at 8192³ the roll-off is the larger: the plateau's curve as fitted to the large GEMMs
    assert float(compute.gemm_efficiency(H100, 8192, 8192, 8192)) == pytest.approx(
        float(compute.gemm_efficiency(plain, 8192, 8192, 8192)), rel=1e-3)


def test_fp8_faster_than_bf16_on_h100_for_large_gemms():
    flops = 2.0 * 8192 ** 3
    bf16 = compute.gemm_time_s(H100, flops, 8192, 8192, 8192, "bf16")
    fp8 = compute.gemm_time_s(H100, flops, 8192, 8192, 8192, "fp8")
    assert fp8 < 0.7 * bf16
    # and a whole step of a large model
    plan = [Plan(tp=8, pp=2, sp=True, recompute=Recompute.SELECTIVE, zero=1)]
    step = {}
    for precision in (Precision.BF16, Precision.FP8):
        training = TrainingSpec(seq_len=8192, global_batch_size=128, precision=precision)
        step[precision] = sum(terms(LLAMA_70B, 64, plan, training).values())[0]
    assert step[Precision.FP8] < step[Precision.BF16]


def test_fp8_refused_where_the_profile_has_no_fp8():
    with pytest.raises(InputError):
        terms(LLAMA_7B, 8, [Plan(tp=1)], TrainingSpec(precision=Precision.FP8), profile=A100)


def test_model_flops_match_megatron_gpt_formula():
    # GPT, causal attention counted at half (Megatron num_floating_point_operations):
    # per layer fwd 24·s·h² GEMMs + 2·s²·h core; ×3 fwd+bwd; logits 6·s·h·V
    # → 72·B·s·l·h²·(1 + s/(12h) + V/(12·l·h))
    h, layers, s, batch, vocab = 1024, 4, 2048, 8, 51200
    model = gpt(h, layers, 16)
    expected = 72 * batch * s * layers * h * h * (1 + s / (12 * h) + vocab / (12 * layers * h))
    training = TrainingSpec(seq_len=s, global_batch_size=batch)
    # plain-GELU GPT has biases: their FLOPs are not GEMMs and are not counted (as in Megatron)
    assert steptime.model_flops_per_step(model, training) == pytest.approx(expected, rel=1e-12)


def test_hardware_flops_count_recompute():
    training = TrainingSpec(seq_len=2048, global_batch_size=8)
    model = gpt(1024, 4, 16)
    plans = PlanArrays.from_plans([Plan(), Plan(recompute=Recompute.SELECTIVE), Plan(recompute=Recompute.FULL)])
    flops = steptime.hardware_flops_per_step(model, training, plans)
    model_flops = steptime.model_flops_per_step(model, training)
    # a fused attention backward recomputes the scores: +0.5 core forward (2·s²·h per layer per sequence, causal)
    core_forward = 8 * 4 * 2 * 2048 ** 2 * 1024
    flash = 0.5 * core_forward
    assert flops[0] == pytest.approx(model_flops + flash)
    # selective adds the causal attention core forward: 2·s²·h per layer per sequence (half of 4·s²·h)
    assert flops[1] - model_flops - flash == pytest.approx(core_forward)
    # full adds one forward of every layer: 24·s·h² + 2·s²·h per layer per sequence
    layer_forward = 24 * 2048 * 1024 ** 2 + 2 * 2048 ** 2 * 1024
    assert flops[2] - model_flops - flash == pytest.approx(8 * 4 * layer_forward)
    unfused = dataclasses.replace(training, flash_attention=False)
    assert steptime.hardware_flops_per_step(model, unfused, plans)[0] == \
        pytest.approx(steptime.model_flops_per_step(model, unfused))


# ---- topology ----------------------------------------------------------------------------------------------------

def test_group_placement_follows_megatron_rank_order():
    plans = PlanArrays.from_plans([Plan(tp=8, pp=2), Plan(tp=2, cp=2, pp=2), Plan(tp=16)])
    tp = comm.tp_group(plans, 8)
    assert list(tp.crosses_nodes) == [False, False, True]          # TP=16 spans two nodes
    # dp·cp groups on 32 GPUs: tp8 pp2 → dp 2 with stride 8: one member per node, 2 nodes
    dp = comm.dp_cp_group(plans, 32, 8)
    assert list(dp.size) == [2, 8, 2]
    assert list(dp.members_per_node) == [1, 4, 1]                  # stride 2 → 4 members of the group per node
    # the pipeline is outermost: stride 32/pp = 16 → every stage on its own node
    assert list(comm.pp_group(plans, 32, 8).crosses_nodes) == [True, True, False]


def test_tp_traffic_on_nvlink_while_the_tp_group_fits_a_node():
    model, training = LLAMA_7B, TrainingSpec(seq_len=4096, global_batch_size=64)
    plans = [Plan(tp=4), Plan(tp=8), Plan(tp=16)]
    tp_s = terms(model, 16, plans, training)["tp_comm"]
    point = H100.collectives["nvlink"]["all_reduce"][-1]                # the profile's fitted 8-GPU all-reduce
    assert point.group_size == 8
    # tp=8, no SP: per layer 4 all-reduces of b·s·h·2 = 32 MiB, per microbatch, on NVLink:
    # 4 · 32 layers · (alpha + 2·7/8 · 33554432 / busbw), × m = 64/(2·1) microbatches
    one = point.alpha_s + 2 * 7 / 8 * 4096 * 4096 * 2 / point.bus_bandwidth_bytes_per_s
    assert tp_s[1] == pytest.approx(4 * 32 * one * 32)
    # across nodes the same collective is priced with an InfiniBand stage: tp=16 costs more per step
    assert tp_s[2] > tp_s[1]


def test_ep_all_to_all_slows_down_when_the_ep_group_crosses_nodes():
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    plan = [Plan(tp=1, ep=8, zero=1)]
    inside = terms(MIXTRAL, 16, plan, training, gpus_per_node=8)["ep_comm"][0]
    across = terms(MIXTRAL, 16, plan, training, gpus_per_node=4)["ep_comm"][0]
    assert across > 2 * inside > 0


def test_cp_ring_is_hidden_behind_long_attention_and_exposed_across_nodes_at_short_sequences():
    plan = [Plan(tp=8, cp=2, sp=True)]                    # cp stride 8: the two CP ranks sit on different nodes

    def cp_s(seq, gpus_per_node, nccl_ctas=16):
        return terms(LLAMA_7B, 16, plan, TrainingSpec(seq_len=seq, global_batch_size=16, nccl_ctas=nccl_ctas),
                     gpus_per_node=gpus_per_node)["cp_comm"][0]

    assert cp_s(4096, 8) > cp_s(4096, 16) > 0             # InfiniBand ring vs NVLink ring
    assert cp_s(4096, 8) == cp_s(4096, 8, nccl_ctas=0)    # each send outlasts its chunk of core: no contention on top
    assert cp_s(131072, 8, nccl_ctas=0) == 0.0            # attention (∝ s²) hides the K/V exchange (∝ s) ...
    # ... and what is left is the SMs the hidden sends take from the attention beside them: 16/132 of their length
    assert 0.0 < cp_s(131072, 8) == pytest.approx(2 * cp_s(131072, 8, nccl_ctas=8))


def test_imbalance_slows_experts_and_capacity_caps_it():
    plan = [Plan(tp=1, ep=8, zero=1)]
    balanced = terms(MIXTRAL, 8, plan, TrainingSpec(global_batch_size=64))
    skewed = terms(MIXTRAL, 8, plan, TrainingSpec(global_batch_size=64, moe_imbalance_factor=1.5))
    capped = terms(MIXTRAL, 8, plan, TrainingSpec(global_batch_size=64, moe_imbalance_factor=1.5,
                                                  moe_capacity_factor=1.0))
    assert skewed["compute"][0] > balanced["compute"][0]
    assert skewed["ep_comm"][0] > balanced["ep_comm"][0]
    assert capped["compute"][0] == pytest.approx(balanced["compute"][0])


# ---- pipeline ----------------------------------------------------------------------------------------------------

def test_no_bubble_and_no_p2p_without_pipeline():
    t = terms(LLAMA_7B, 8, [Plan(tp=2, sp=True), Plan(tp=1, zero=1, mbs=2)])
    assert np.all(t["pp_bubble"] == 0) and np.all(t["pp_p2p"] == 0)


def test_bubble_fraction_falls_with_microbatches_and_with_vpp():
    plans = PlanArrays.from_plans([Plan(pp=4), Plan(pp=4, vpp=2), Plan(pp=4, vpp=4)])
    # (p-1)/(v·m): 3/8, 3/16, 3/32 at m = 8; 3/16 at m = 16
    assert list(pipeline.bubble_fraction(plans, np.array([8, 8, 8]))) == [3 / 8, 3 / 16, 3 / 32]
    assert pipeline.bubble_fraction(plans, np.array([16, 16, 16]))[0] == 3 / 16
    # in the step time: the bubble's share of the step falls as gbs (microbatches) grows and as vpp grows
    shares = []
    for gbs in (32, 64, 128):
        t = terms(LLAMA_7B, 16, [Plan(tp=2, pp=4, sp=True)], TrainingSpec(seq_len=4096, global_batch_size=gbs))
        shares.append(t["pp_bubble"][0] / sum(t.values())[0])
    assert shares[0] > shares[1] > shares[2]
    blocking = TrainingSpec(seq_len=4096, global_batch_size=1024, overlap_p2p_comm=False)
    by_vpp = terms(LLAMA_7B, 16, [Plan(tp=2, pp=4, vpp=v, sp=True) for v in (1, 2, 4)], blocking)
    assert by_vpp["pp_bubble"][0] > by_vpp["pp_bubble"][1] > by_vpp["pp_bubble"][2]
    assert by_vpp["pp_p2p"][0] < by_vpp["pp_p2p"][1] < by_vpp["pp_p2p"][2]      # v times the transfers


@pytest.mark.parametrize("pp, vpp, m, overlap, group, exposed, overlapped", [
    # 2(v·m + p − 1) transfers; overlapped: the steady state's backward sends, v·m − warmup, warmup =
    # min(2(p−1) + (v−1)·g, v·m) chunk passes (Megatron's first rank, g the micro-batch group, default p); its
    # forward sends block (core_v0.18+)
    (4, 2, 8, True, 0, 2 * (16 + 3) - (16 - 10), 16 - 10),        # warmup 6 + 4 = 10
    (4, 2, 16, True, 8, 2 * (32 + 3) - (32 - 14), 32 - 14),       # g = 8: warmup 6 + 8 = 14
    (4, 2, 8, True, 2, 2 * (16 + 3) - (16 - 10), 16 - 10),        # a group below p is taken as p
    (4, 2, 8, False, 0, 2 * (16 + 3), 0),                         # --no-overlap-p2p-communication: all block
    (4, 1, 8, True, 0, 2 * (8 + 3), 0),                           # non-interleaved: Megatron turns it off
    (4, 4, 2, True, 0, 2 * (8 + 3), 0),                           # warmup 6 + 12 > v·m = 8: every pass warms up
    (1, 1, 8, True, 0, 0, 0),                                     # no pipeline
])
def test_p2p_transfers_block_in_warmup_and_cooldown_and_overlap_in_the_steady_state(pp, vpp, m, overlap, group,
                                                                                       exposed, overlapped):
    plans = PlanArrays.from_plans([Plan(pp=pp, vpp=vpp)])
    training = TrainingSpec(overlap_p2p_comm=overlap, microbatch_group_size_per_vp_stage=group)
    got_exposed, got_overlapped = pipeline.p2p_transfer_counts(training, plans, np.array([m]))
    assert (got_exposed[0], got_overlapped[0]) == (exposed, overlapped)


def test_without_sp_each_tp_rank_sends_its_whole_replica_unless_the_old_scatter_gather_runs():
    """Megatron-Core sends the tensor a rank holds (get_tensor_shapes divides the sequence by tp only under SP): 1/tp
    of the activation with SP, all of it without; Megatron-LM before core's p2p (TrainingSpec.p2p_scatter_gather)
    sent 1/tp without SP too and all-gathered it over the TP group on the receiving stage."""
    plans = PlanArrays.from_plans([Plan(tp=8, pp=4, sp=True), Plan(tp=8, pp=4, sp=False)])
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    whole = 4096 * LLAMA_7B.hidden_size * 2.0
    assert list(pipeline.p2p_bytes(LLAMA_7B, training, plans)) == [whole / 8, whole]
    legacy = dataclasses.replace(training, p2p_scatter_gather=True)
    assert list(pipeline.p2p_bytes(LLAMA_7B, legacy, plans)) == [whole / 8, whole / 8]
    core = pipeline.p2p_transfer_s(LLAMA_7B, H100, training, plans, 32, 8)
    old = pipeline.p2p_transfer_s(LLAMA_7B, H100, legacy, plans, 32, 8)
    assert core[0] == old[0] and core[1] > 4 * core[0]        # across nodes: 8x the bytes on each rank's NIC
    regather = comm.group_collective_time_s(H100, comm.tp_group(plans.take([1]), 8), "all_gather", whole)
    assert old[1] == pytest.approx(core[0] + float(regather[0]))


def test_overlapped_p2p_costs_its_cta_share_beside_a_long_chunk_and_its_excess_beside_a_short_one():
    """An overlapped transfer adds max(its excess over the chunk's forward, NCCL's SM share × itself)."""
    plans = PlanArrays.from_plans([Plan(tp=2, pp=4, vpp=2, sp=True), Plan(tp=2, pp=4, vpp=1, sp=True)])
    cluster = ClusterSpec(profile=H100, num_gpus=16)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    m = np.array([32.0, 32.0])
    one = pipeline.p2p_transfer_s(LLAMA_7B, H100, training, plans, 16, 8)
    window = steptime.chunk_forward_s(LLAMA_7B, cluster, training, plans)
    assert np.all(window > one)                      # 4 layers a chunk: the transfer fits beside it
    share = 16 / H100.streaming_multiprocessors
    on = steptime.pp_p2p_s(LLAMA_7B, cluster, training, plans, m)
    off = steptime.pp_p2p_s(LLAMA_7B, cluster, dataclasses.replace(training, overlap_p2p_comm=False), plans, m)
    # vpp 2: of 2(64 + 3) = 134 transfers the 64 − 10 = 54 steady backward sends overlap at the CTA share
    assert on[0] == pytest.approx((80 + 54 * share) * one[0], rel=1e-12)
    assert off[0] == pytest.approx(134 * one[0], rel=1e-12) and on[1] == off[1]
    free = steptime.pp_p2p_s(LLAMA_7B, cluster, dataclasses.replace(training, nccl_ctas=0), plans, m)
    assert free[0] == pytest.approx(80 * one[0], rel=1e-12)
    # a chunk shorter than the transfer (here forced: a real one-layer chunk still outlasts these transfers, its
    # launch floor included): each overlapped transfer adds its excess
    short = 0.25 * one
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(steptime, "chunk_forward_s", lambda *args: short)
        got = steptime.pp_p2p_s(LLAMA_7B, cluster, training, plans, m)
    assert got[0] == pytest.approx((80 + 54 * 0.75) * one[0], rel=1e-12) and got[1] == off[1]


# ---- bookkeeping -------------------------------------------------------------------------------------------------

def test_time_terms_sum_to_the_step_time_and_are_non_negative():
    from costmodels.evaluate import evaluate

    cluster = ClusterSpec(profile=H100, num_gpus=16)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    plans = [Plan(tp=2, pp=2, sp=True, zero=1), Plan(tp=1, ep=8, zero=1), Plan(tp=4, cp=2, sp=True, zero=3)]
    evaluation = evaluate(MIXTRAL, cluster, training, plans)
    total = sum(evaluation.time_terms_s.values())
    np.testing.assert_allclose(evaluation.step_time_s, total)
    np.testing.assert_allclose(steptime.step_time_s(MIXTRAL, cluster, training, PlanArrays.from_plans(plans)), total)
    assert all(np.all(v >= 0) for v in evaluation.time_terms_s.values())
    assert set(evaluation.time_terms_s) == set(steptime.TERM_KNOBS) - {steptime.OFFLOAD_TERM}


KNOB_VALUES = {
    "tp": (1, 2, 4), "pp": (1, 2, 4), "vpp": (1, 2), "cp": (1, 2), "ep": (1, 2, 4, 8), "etp": (1, 2),
    "mbs": (1, 2), "sp": (False, True), "recompute": (0, 1, 2), "recompute_layers": (0, 1, 2),
    "zero": (0, 1, 2, 3), "first_stage_layers": (0, 6), "last_stage_layers": (0, 6),
}
plan_strategy = st.fixed_dictionaries({name: st.sampled_from(values) for name, values in KNOB_VALUES.items()})


@given(plan_strategy, st.sampled_from(sorted(KNOB_VALUES)), st.data())
def test_a_term_does_not_move_when_a_knob_outside_its_knob_set_changes(values, knob, data):
    """TERM_KNOBS is what the CP-SAT tables are built from: a knob not listed must not change the term. With
    fine-grained offloading over a slow host link, so that its copies (a term only then) cost time."""
    other = data.draw(st.sampled_from([v for v in KNOB_VALUES[knob] if v != values[knob]]))
    base = PlanArrays.from_columns(**values)
    moved = PlanArrays.from_columns(**dict(values, **{knob: other}))
    training = TrainingSpec(seq_len=4096, global_batch_size=128, offload_modules=("core_attn", "expert_fc1"))
    slow_host = dataclasses.replace(H100, host_link_bytes_per_s=1e9)
    before = terms(MIXTRAL, 64, [base.plan(0)], training, profile=slow_host)
    after = terms(MIXTRAL, 64, [moved.plan(0)], training, profile=slow_host)
    assert set(before) == set(steptime.TERM_KNOBS)
    for term, knobs in steptime.TERM_KNOBS.items():
        if knob not in knobs:
            assert after[term][0] == pytest.approx(before[term][0], rel=1e-12, abs=1e-15), (term, knob)


def test_term_knobs_name_plan_fields():
    for term, knobs in steptime.TERM_KNOBS.items():
        assert set(knobs) <= set(PLAN_FIELDS), term


@given(st.lists(plan_strategy, min_size=2, max_size=6))
def test_vectorised_equals_one_at_a_time(rows):
    plans = [PlanArrays.from_columns(**values).plan(0) for values in rows]
    together = terms(MIXTRAL, 64, plans)
    for i, plan in enumerate(plans):
        alone = terms(MIXTRAL, 64, [plan])
        for term in together:
            assert together[term][i] == pytest.approx(alone[term][0], rel=1e-12, abs=1e-15)
            assert math.isfinite(together[term][i])


# ---- communication overlap options (TrainingSpec; Megatron-LM's defaults: off, P2P of interleaving on) ---------

def test_overlaps_default_off_and_each_hides_its_own_term():
    model, plans = MIXTRAL, PlanArrays.from_plans([Plan(tp=2, sp=True, ep=8, zero=1, mbs=1)])
    base = TrainingSpec(seq_len=4096, global_batch_size=256)
    off = terms(model, 64, plans, base)
    for option, term in (("overlap_grad_reduce", "dp_comm"), ("tp_comm_overlap", "tp_comm"),
                         ("moe_a2a_overlap", "ep_comm")):
        on = terms(model, 64, plans, dataclasses.replace(base, **{option: True}))
        assert on[term][0] < off[term][0], option
        changed = {name for name in off if not math.isclose(on[name][0], off[name][0], rel_tol=1e-12)}
        # overlapping the grad reduce cuts the buffers into buckets, each checked for NaN on the host at the step
        # (engines.megatron_bucket_checks, in the optimizer term)
        checks = {"optimizer"} if option == "overlap_grad_reduce" else set()
        assert changed <= {term, "pp_bubble"} | checks, (option, changed)


def test_param_gather_overlap_needs_grad_reduce_overlap():
    with pytest.raises(InputError, match="overlap_grad_reduce"):
        TrainingSpec(overlap_param_gather=True)
    base = TrainingSpec(seq_len=4096, global_batch_size=256, overlap_grad_reduce=True)
    plans = PlanArrays.from_plans([Plan(tp=2, sp=True, ep=8, zero=1)])
    both = terms(MIXTRAL, 64, plans, dataclasses.replace(base, overlap_param_gather=True))
    assert both["dp_comm"][0] < terms(MIXTRAL, 64, plans, base)["dp_comm"][0]


def test_tp_overlap_needs_sequence_parallelism_and_keeps_the_first_chunk():
    base = TrainingSpec(seq_len=4096, global_batch_size=256, tp_comm_overlap=True)
    no_sp = PlanArrays.from_plans([Plan(tp=8, sp=False)])
    assert terms(MIXTRAL, 64, no_sp, base)["tp_comm"][0] == \
        terms(MIXTRAL, 64, no_sp, dataclasses.replace(base, tp_comm_overlap=False))["tp_comm"][0]
    # with a long GEMM window only the first of tp chunks stays exposed
    comm_s = np.array([8.0]); tp = np.array([8])
    assert steptime.tp_overlap_exposed_s(comm_s, np.array([100.0]), tp)[0] == pytest.approx(1.0)
    assert steptime.tp_overlap_exposed_s(comm_s, np.array([0.0]), tp)[0] == pytest.approx(8.0)


def test_tp_overlap_hides_each_collective_behind_its_own_gemm_only():
    # a long output GEMM cannot hide the input all-gather: each collective pairs with the GEMM it is fused with
    gather, scatter, tp, none = np.array([4.0]), np.array([4.0]), np.array([4]), np.array([0.0])
    short_in = steptime.tp_block_overlapped_s(gather, scatter, np.array([0.0]), np.array([100.0]), tp, none)
    # forward: gather fully exposed (4) + scatter's first chunk (1); backward: gather behind the output dgrad (1)
    # + the bulk scatter beside the input wgrad, fully exposed (4)
    assert short_in[0] == pytest.approx(4.0 + 1.0 + 1.0 + 4.0)
    both_long = steptime.tp_block_overlapped_s(gather, scatter, np.array([100.0]), np.array([100.0]), tp, none)
    assert both_long[0] == pytest.approx(1.0 + 1.0 + 1.0 + 0.0)
    # a recomputed forward repeats the forward's collectives
    recomputed = steptime.tp_block_overlapped_s(gather, scatter, np.array([100.0]), np.array([100.0]), tp,
                                                np.array([1.0]))
    assert recomputed[0] == pytest.approx(both_long[0] + 2.0)


def test_tp_overlap_exposes_more_for_a_narrow_model_than_the_whole_layer_window_would():
    # a 7B model at tp 8: the SP collectives are longer than the QKV and output projections they are fused with,
    # so part of them stays exposed even though the layer's total GEMM time exceeds the total communication
    training = TrainingSpec(seq_len=8192, global_batch_size=64, tp_comm_overlap=True)
    plans = PlanArrays.from_plans([Plan(tp=8, sp=True)])
    overlapped = terms(LLAMA_7B, 8, plans, training)["tp_comm"][0]
    exposed = terms(LLAMA_7B, 8, plans, dataclasses.replace(training, tp_comm_overlap=False))["tp_comm"][0]
    first_chunks_only = exposed / 8
    assert first_chunks_only < overlapped < exposed


def test_a2a_overlap_leaves_the_first_microbatch_exposed():
    a2a = np.array([2.0])
    assert steptime.ep_overlap_exposed_s(a2a, np.array([0.0]), np.array([4.0]))[0] == pytest.approx(2.0)
    assert steptime.ep_overlap_exposed_s(a2a, np.array([1.5]), np.array([4.0]))[0] == pytest.approx(2.0 + 3 * 1.5)


def test_a2a_overlap_hides_each_all_to_all_only_behind_its_own_phase():
    """Megatron-Core's TransformerLayerSchedulePlan.run: combine_bwd beside the pre-dispatch forward, dispatch_fwd
    and dispatch_bwd beside the routed MLP's backward and forward, combine_fwd beside the pre-dispatch backward.
    By hand: one all-to-all 1.5 ms; pre-dispatch forward 1 ms (core 0.25 ms, its backward 0.625 ms), the MoE layer's
    forward 3 ms, no backward extra, no SMs taken (nccl_ctas 0)."""
    times = compute.LayerTimes(
        dense_layer_fwd_s=np.array([0.0]), moe_layer_fwd_s=np.array([3.0e-3]), attention_core_fwd_s=np.array([0.25e-3]),
        logits_fwd_s=np.array([0.0]), mtp_fwd_s=np.array([0.0]), attention_core_bwd_s=np.array([0.625e-3]),
        moe_pre_dispatch_fwd_s=np.array([1.0e-3]))
    plans = PlanArrays.from_plans([Plan(ep=8)])
    one = np.array([1.5e-3])
    paired = steptime.ep_paired_exposed_s(MIXTRAL, H100, TrainingSpec(nccl_ctas=0), plans, times, np.array([0]), one)
    pre_bwd = 2 * (1.0e-3 - 0.25e-3) + 0.625e-3                  # 2.125 ms: hides combine_fwd
    routed = 2.0e-3 + 2 * 2.0e-3                                  # 6 ms: hides both dispatches
    per_layer = (1.5e-3 - 1.0e-3) + max(3.0e-3 - routed, 0.0) + max(1.5e-3 - pre_bwd, 0.0)
    assert per_layer == pytest.approx(0.5e-3)
    assert paired[0] == pytest.approx(MIXTRAL.num_layers * per_layer)
    # the layer's compute (9.1 ms) is longer than its four all-to-alls (6 ms), yet the combine_bwd phase shows
    assert paired[0] > 0.0


def test_a2a_overlap_leaves_the_interleaved_warmup_and_cooldown_exposed():
    """Megatron-Core's combined 1F1B pairs a forward chunk with a backward chunk only in the steady state: the
    (p−1)·2 + (v−1)·p + 1 warmup forwards and as many cooldown backwards keep their all-to-alls."""
    a2a, paired, m = np.array([2.0]), np.array([0.0]), np.array([16.0])
    plans = PlanArrays.from_plans([Plan(pp=4, vpp=2, ep=8)])
    alone = (3 * 2 + 1 * 4 + 1) / 2                  # 11 chunk passes of 1/2 micro-batch each
    assert steptime.ep_overlap_exposed_s(a2a, paired, m, plans)[0] == pytest.approx(alone * 2.0)
    # every chunk in the warmup: nothing overlaps
    assert steptime.ep_overlap_exposed_s(a2a, paired, np.array([4.0]), plans)[0] == pytest.approx(4 * 2.0)
    # a micro-batch group of 8 warms up (v−1)·8 chunk passes instead of (v−1)·4
    assert steptime.ep_overlap_exposed_s(a2a, paired, m, plans, 8)[0] == pytest.approx((3 * 2 + 8 + 1) / 2 * 2.0)


@pytest.mark.parametrize("plan, overlaps", [
    (Plan(tp=2, sp=True, pp=4, vpp=2, ep=8), True),
    (Plan(tp=2, sp=True, ep=8), True),
    (Plan(tp=2, sp=True, pp=4, ep=8), False),                          # pp > 1 needs interleaving
    (Plan(tp=2, sp=True, pp=4, vpp=2, ep=8, recompute=Recompute.FULL), False),
    (Plan(tp=2, sp=True, ep=8, recompute=Recompute.SELECTIVE, recompute_modules=("moe",)), False),
    (Plan(tp=2, sp=True, ep=8, recompute=Recompute.SELECTIVE, recompute_modules=("moe_act",)), True),
    (Plan(tp=2, sp=True, ep=1), False),                                # nothing to exchange
])
def test_a2a_overlap_is_priced_only_where_megatron_core_runs_it(plan, overlaps):
    assert not steptime.ep_a2a_overlap_applies(dataclasses.replace(MIXTRAL, num_mtp_layers=2),
                                               TrainingSpec(moe_a2a_overlap=True), PlanArrays.from_plans([plan]))[0]
    """TransformerConfig refuses --overlap-moe-expert-parallel-comm with pp > 1 and no virtual pipeline, full
    recompute or 'moe' recomputed; there the all-to-all is priced exposed, and the export leaves the flag out."""
    from test_report_support import synthetic_estimate

    from autopar.export import emit

    base = TrainingSpec(seq_len=4096, global_batch_size=256)
    on = terms(MIXTRAL, 64, [plan], dataclasses.replace(base, moe_a2a_overlap=True))["ep_comm"][0]
    off = terms(MIXTRAL, 64, [plan], base)["ep_comm"][0]
    assert bool(on < off) is overlaps and bool(on == off) is (not overlaps)
    estimate = synthetic_estimate(MIXTRAL, ClusterSpec(profile=H100, num_gpus=64),
                                  dataclasses.replace(base, moe_a2a_overlap=True), plan)
    assert ("--overlap-moe-expert-parallel-comm" in emit(estimate, "megatron").split()) is overlaps


def test_cross_entropy_moves_its_bytes_per_logit_on_the_last_stage_only():
    # hand arithmetic: 4096 tokens × 32000/1 logits, unfused 38 + 14 bytes each at the H100's HBM bandwidth
    training = TrainingSpec(seq_len=4096, global_batch_size=8, cross_entropy="unfused")
    plans = PlanArrays.from_plans([Plan(tp=1, mbs=1)])
    forward_s, backward_s = compute.loss_times_s(LLAMA_7B, H100, training, plans)
    logits = 4096 * padded_vocab_size(LLAMA_7B, np.array([1]))[0]
    assert forward_s[0] == pytest.approx(logits * 38 / H100.hbm_bandwidth_bytes_per_s)
    assert backward_s[0] == pytest.approx(logits * 14 / H100.hbm_bandwidth_bytes_per_s)
    fused_s = compute.loss_times_s(LLAMA_7B, H100, dataclasses.replace(training, cross_entropy="fused"), plans)
    assert sum(f[0] for f in fused_s) < forward_s[0] + backward_s[0]
    # apex's xentropy: two reads of the bf16 row forward (2 + 2), a read and a write backward (2 + 2)
    xentropy_s = compute.loss_times_s(LLAMA_7B, H100, dataclasses.replace(training, cross_entropy="xentropy"), plans)
    assert xentropy_s[0][0] == pytest.approx(logits * 4 / H100.hbm_bandwidth_bytes_per_s)
    assert xentropy_s[1][0] == pytest.approx(logits * 4 / H100.hbm_bandwidth_bytes_per_s)
    # on a pipeline only the last stage pays it: the stage split is even, so the first and last stages differ by
    # the embedding-free logits GEMM and the loss
    times = compute.layer_times_s(LLAMA_7B, H100, training, PlanArrays.from_plans([Plan(pp=2)]))
    pp2 = PlanArrays.from_plans([Plan(pp=2)])
    first = steptime.stage_compute_s(LLAMA_7B, training, pp2, times, np.array([0]))
    last = steptime.stage_compute_s(LLAMA_7B, training, pp2, times, np.array([1]))
    assert last[0][0] - first[0][0] == pytest.approx(times.logits_fwd_s[0] + times.loss_fwd_s[0])
    assert last[1][0] - first[1][0] == pytest.approx(2 * times.logits_fwd_s[0] + times.loss_bwd_s[0])


# ---- overlapped communication holds SMs ----------------------------------------------------------------------

def test_an_overlapped_collective_takes_its_ctas_share_of_the_sms_from_the_compute_beside_it():
    # hand arithmetic: the H100's 132 SMs, NCCL's default 16 CTAs; a collective of 2 s hidden behind 10 s of
    # compute delays it by 16/132 × 2 s; none hidden (comm-bound), nothing is added beyond the exposed part
    share = steptime.overlap_contention_share(H100, 16)
    assert share == pytest.approx(16 / 132)
    assert steptime.overlapped_exposed_s(np.array([2.0]), np.array([10.0]), share)[0] == pytest.approx(share * 2.0)
    # communication-bound: the compute (2 s at 1 - share of its rate) ends inside the all-to-all (10 s), which
    # alone sets the pace: 8 s exposed per hidden pair, nothing more
    assert steptime.overlapped_exposed_s(np.array([10.0]), np.array([2.0]), share)[0] == pytest.approx(8.0)
    # at the crossover (comm = window / (1 - share)) both regimes agree
    window = np.array([10.0]); comm = window / (1 - share)
    assert steptime.overlapped_exposed_s(comm, window, share)[0] == pytest.approx(share * comm[0])
    assert steptime.overlapped_exposed_s(comm, window, share)[0] == pytest.approx(comm[0] - window[0])
    # a profile that does not state its SM count prices overlap as before
    unknown = dataclasses.replace(H100, streaming_multiprocessors=0)
    assert steptime.overlap_contention_share(unknown, 16) == 0.0


def test_overlapped_data_parallel_traffic_costs_its_share_and_zero_ctas_is_free_overlap():
    plans = PlanArrays.from_plans([Plan(tp=2, sp=True, zero=1), Plan(tp=1, zero=3, mbs=2)])
    overlapped = TrainingSpec(seq_len=4096, global_batch_size=256, overlap_grad_reduce=True,
                              overlap_param_gather=True)
    with_ctas = terms(LLAMA_7B, 64, plans, overlapped)["dp_comm"]
    free = terms(LLAMA_7B, 64, plans, dataclasses.replace(overlapped, nccl_ctas=0))["dp_comm"]
    more = terms(LLAMA_7B, 64, plans, dataclasses.replace(overlapped, nccl_ctas=32))["dp_comm"]
    assert np.all(free < with_ctas) and np.all(with_ctas < more)
    # the added time is linear in the CTAs: 32 CTAs add twice what 16 add
    np.testing.assert_allclose(more - free, 2 * (with_ctas - free), rtol=1e-9)
    # without overlap nothing is hidden, so the CTAs change nothing (ZeRO-1)
    exposed = dataclasses.replace(overlapped, overlap_grad_reduce=False, overlap_param_gather=False)
    zero1 = PlanArrays.from_plans([Plan(tp=2, sp=True, zero=1)])
    assert terms(LLAMA_7B, 64, zero1, exposed)["dp_comm"][0] == \
        terms(LLAMA_7B, 64, zero1, dataclasses.replace(exposed, nccl_ctas=64))["dp_comm"][0]


def test_tp_comm_overlap_runs_the_pipelined_and_bulk_gemms_beside_te_userbuffer_sms():
    # TE's set_sm_margin: the output GEMM forward and the input GEMM's dgrad + wgrad run on 132 - 16 SMs
    in_s, out_s, none = np.array([3.0]), np.array([5.0]), np.array([0.0])
    margin = steptime.tp_overlap_sm_margin_s(H100, in_s, out_s, none)
    assert margin[0] == pytest.approx((5.0 + 2 * 3.0) * 16 / (132 - 16))
    recomputed = steptime.tp_overlap_sm_margin_s(H100, in_s, out_s, np.array([1.0]))
    assert recomputed[0] == pytest.approx((2 * 5.0 + 2 * 3.0) * 16 / (132 - 16))


def test_a_communication_bound_zero3_step_pays_its_traffic_and_no_contention_on_top():
    # Mixtral's 47B parameters gathered twice and reduce-scattered per micro-batch of 512 tokens: the traffic is
    # several times the compute, so the compute ends inside it and the CTAs it holds cost nothing extra
    plans = PlanArrays.from_plans([Plan(tp=1, zero=3, mbs=1)])
    training = TrainingSpec(seq_len=512, global_batch_size=64)
    busy = terms(MIXTRAL, 64, plans, training)
    assert busy["dp_comm"][0] > 2 * busy["compute"][0]
    assert busy["dp_comm"][0] == terms(MIXTRAL, 64, plans, dataclasses.replace(training, nccl_ctas=0))["dp_comm"][0]


@pytest.mark.parametrize("zero, overlap", [(1, True), (2, False)])
def test_communication_bound_zero1_overlap_and_zero2_pay_no_contention_on_top(zero, overlap):
    # 64 GPUs of 8 nodes, Mixtral's gradients reduced across nodes after micro-batches of 256 tokens: each
    # collective outlasts the backward beside it
    plans = PlanArrays.from_plans([Plan(tp=1, zero=zero, mbs=1)])
    training = TrainingSpec(seq_len=256, global_batch_size=256, overlap_grad_reduce=overlap,
                            overlap_param_gather=overlap)
    busy = terms(MIXTRAL, 64, plans, training)
    cluster = ClusterSpec(profile=H100, num_gpus=64)
    reduce_s, _, last_bucket_s, _ = steptime.dp_traffic_s(MIXTRAL, cluster, plans, np.zeros(1, dtype=int))
    microbatches = steptime.num_microbatches(plans, 64, training.global_batch_size)[0]
    assert microbatches == 4
    assert reduce_s[0] - last_bucket_s[0] > busy["compute"][0] / microbatches   # longer than a whole micro-batch
    assert busy["dp_comm"][0] == pytest.approx(
        terms(MIXTRAL, 64, plans, dataclasses.replace(training, nccl_ctas=0))["dp_comm"][0], rel=1e-12)


def test_bf16_gradient_reduce_halves_the_reduce_bytes_and_pays_the_fp32_copy_in_the_optimizer():
    # grad_reduce_in_fp32 off: every gradient collective carries 2 bytes per element, not 4; the parameter gather
    # is bf16 either way. Megatron's optimizers then copy the bf16 gradient to fp32 (read 2, write 4 bytes per
    # param) before Adam's 34: optimizer time x (34 + 6) / 34 under zero <= 1; DeepSpeed/FSDP (zero >= 2) unchanged.
    cluster = ClusterSpec(profile=H100, num_gpus=64)
    plans = PlanArrays.from_plans([Plan(tp=1, zero=1, mbs=1), Plan(tp=1, zero=0, mbs=1), Plan(tp=1, zero=2, mbs=1)])
    stage = np.zeros(3, dtype=int)
    fp32_reduce, fp32_gather, _, _ = steptime.dp_traffic_s(MIXTRAL, cluster, plans, stage, grad_bytes=4)
    bf16_reduce, bf16_gather, _, _ = steptime.dp_traffic_s(MIXTRAL, cluster, plans, stage, grad_bytes=2)
    np.testing.assert_array_equal(bf16_gather, fp32_gather)
    # the same collectives at half the bytes: all bandwidth, so about half the time, and never more
    assert np.all(bf16_reduce < fp32_reduce) and np.all(bf16_reduce > 0.45 * fp32_reduce)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    bf16_training = dataclasses.replace(training, grad_reduce_in_fp32=False)
    fp32_terms, bf16_terms = terms(MIXTRAL, 64, plans, training), terms(MIXTRAL, 64, plans, bf16_training)
    # the optimizer term also carries the host's share of the step (engines.step_host_s), the same either way
    host_s = engines.step_host_s(MIXTRAL, training, plans, H100.host_costs, 64, 0)
    np.testing.assert_array_equal(host_s, engines.step_host_s(MIXTRAL, bf16_training, plans, H100.host_costs, 64, 0))
    np.testing.assert_allclose((bf16_terms["optimizer"] - host_s) / (fp32_terms["optimizer"] - host_s),
                               [40 / 34, 40 / 34, 1.0], rtol=1e-12)
    assert np.all(bf16_terms["dp_comm"] < fp32_terms["dp_comm"])
    for name in ("compute", "tp_comm", "ep_comm", "pp_bubble"):
        np.testing.assert_array_equal(bf16_terms[name], fp32_terms[name])


def test_tp_comm_overlap_charges_the_userbuffer_margin_once_per_overlapped_block():
    training = TrainingSpec(seq_len=4096, global_batch_size=64, tp_comm_overlap=True)
    plans = PlanArrays.from_plans([Plan(tp=4, sp=True, mbs=1)])
    # a calibrated overlap fraction discounts the collectives only, never the GEMMs' SM margin
    calibrated = dataclasses.replace(H100, extra={**H100.extra, "overlap": {"tp_comm": 0.5}})
    cluster = ClusterSpec(profile=calibrated, num_gpus=8)
    no_sms = ClusterSpec(profile=dataclasses.replace(calibrated, streaming_multiprocessors=0), num_gpus=8)
    times = compute.layer_times_s(LLAMA_7B, H100, training, plans)
    stage = np.zeros(1, dtype=int)
    with_margin = steptime.tp_comm_s(LLAMA_7B, cluster, training, plans, stage, times.tp_overlap)
    without = steptime.tp_comm_s(LLAMA_7B, no_sms, training, plans, stage, times.tp_overlap)
    gemms = times.tp_overlap
    per_layer = steptime.tp_overlap_sm_margin_s(H100, gemms.attention_in_s, gemms.attention_out_s, np.zeros(1)) \
        + steptime.tp_overlap_sm_margin_s(H100, gemms.mlp_in_s, gemms.mlp_out_s, np.zeros(1))
    assert with_margin[0] - without[0] == pytest.approx(LLAMA_7B.num_layers * per_layer[0])
    assert per_layer[0] > 0


def test_nccl_ctas_is_validated():
    for bad in (-1, 65, 1.5, True, "16"):
        with pytest.raises(InputError, match="nccl_ctas"):
            TrainingSpec(nccl_ctas=bad)


def test_the_gradient_reduce_dtype_is_a_boolean():
    for bad in (0, "false", None):
        with pytest.raises(InputError, match="grad_reduce_in_fp32"):
            TrainingSpec(grad_reduce_in_fp32=bad)


# ---- sustained clock -----------------------------------------------------------------------------------------

def test_a_training_step_runs_compute_bound_kernels_at_the_sustained_clock_and_memory_bound_ones_unchanged():
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    plans = PlanArrays.from_plans([Plan(tp=2, sp=True, mbs=2)])
    burst = dataclasses.replace(H100, sustained_clock_fraction=1.0)
    half = dataclasses.replace(H100, sustained_clock_fraction=0.5)
    fast, slow = compute.layer_times_s(LLAMA_7B, burst, training, plans), \
        compute.layer_times_s(LLAMA_7B, half, training, plans)
    gemms = compute.attention_gemms(LLAMA_7B, training, plans) + \
        compute.mlp_gemms(LLAMA_7B, compute._tokens(training, plans), LLAMA_7B.ffn_hidden_size, plans.tp.astype(float))
    gemm_s = compute._gemms_time_s(burst, training, gemms)
    # halving the clock doubles the GEMMs and the attention core, and leaves the elementwise bytes alone
    np.testing.assert_allclose(slow.dense_layer_fwd_s - fast.dense_layer_fwd_s, gemm_s, rtol=1e-9)
    np.testing.assert_allclose(slow.core_backward_s(training), 2 * fast.core_backward_s(training), rtol=1e-9)
    np.testing.assert_allclose(slow.loss_fwd_s, fast.loss_fwd_s, rtol=1e-12)
    # the fitted (burst) curve itself is untouched: calibration fits it to microbenchmarks as measured
    assert compute.gemm_time_s(half, np.array([1e12]), 8192, 8192, 8192, "bf16")[0] == \
        compute.gemm_time_s(burst, np.array([1e12]), 8192, 8192, 8192, "bf16")[0]


def test_bundled_profiles_throttle_hopper_and_blackwell_but_not_a100():
    for name, fraction in (("a100-80gb", 1.0), ("h100-80gb", 0.795), ("h200-141gb", 0.795), ("h800-80gb", 0.795),
                           ("b200-180gb", 0.804), ("gb200-186gb", 0.804)):
        profile = load_profile(name)
        assert profile.sustained_clock_fraction == pytest.approx(fraction)
        assert "MHz" in profile.provenance["compute.sustained_clock_fraction"] or fraction == 1.0


def test_megatron_all_reduces_a_tied_embedding_between_the_end_stages_once_a_step():
    """finalize_model_grads all-reduces the word embedding's main gradient between the first and the last pipeline
    stage after the DP sync (_allreduce_word_embedding_grads), blocking: V_padded/tp x h elements on a group of
    two ranks num_gpus (pp-1)/pp apart, on the end stages only; nothing without pipelining or with untied
    embeddings, nor under an engine that is not Megatron-Core."""
    tied = ModelSpec(name="gpt-tied", hidden_size=4096, num_layers=32, num_attention_heads=32,
                     ffn_hidden_size=16384, vocab_size=50257, tied_embeddings=True)
    untied = dataclasses.replace(tied, tied_embeddings=False)
    cluster = ClusterSpec(profile=H100, num_gpus=64)
    plans = PlanArrays.from_plans([Plan(tp=2, pp=4), Plan(tp=2, pp=1)])
    training = TrainingSpec(seq_len=2048, global_batch_size=128)
    group = comm.place_group(2, 48, 8)                      # ranks 0 and 48: two nodes
    expected = comm.group_collective_time_s(H100, group, "all_reduce",
                                            padded_vocab_size(tied, np.array([2]))[0] / 2 * 4096 * 4)
    for stage, want in ((0, expected), (3, expected), (1, 0.0)):
        got = steptime.tied_embedding_allreduce_s(tied, cluster, training, plans, np.array([stage, 0]))
        assert got[0] == pytest.approx(float(want)) and got[1] == 0.0
    assert not steptime.tied_embedding_allreduce_s(untied, cluster, training, plans, np.array([0, 0])).any()
    titan = dataclasses.replace(training, engine="torchtitan")
    assert not steptime.tied_embedding_allreduce_s(tied, cluster, titan, plans, np.array([0, 0])).any()
    # Megatron-FSDP all-reduces the rank's shard of the gradient, 1/(dp·cp) of it (dp 8 here)
    fsdp = PlanArrays.from_plans([Plan(tp=2, pp=4, zero=3), Plan(tp=2, pp=4)])
    shard = comm.group_collective_time_s(H100, group, "all_reduce",
                                         padded_vocab_size(tied, np.array([2]))[0] / 2 * 4096 * 4 / 8)
    got = steptime.tied_embedding_allreduce_s(tied, cluster, training, fsdp, np.array([0, 0]))
    assert got[0] == pytest.approx(float(shard)) and got[1] == pytest.approx(float(expected))


def test_selective_core_attention_recompute_reruns_the_context_parallel_ring():
    """Megatron-Core's core_attn recompute re-runs TE's context-parallel attention in the backward
    (_checkpointed_attention_forward), its KV ring with it: one more forward exchange a layer."""
    cluster = ClusterSpec(profile=H100, num_gpus=16)
    plans = PlanArrays.from_plans([Plan(tp=2, cp=8, sp=True), Plan(tp=2, cp=8, sp=True, recompute="selective")])
    training = TrainingSpec(seq_len=65536, global_batch_size=8)
    forward, backward = steptime.cp_exchange_s(MIXTRAL, cluster, training, plans, np.full(2, 1e-4), np.full(2, 2e-4))
    got = steptime.cp_comm_s(MIXTRAL, cluster, training, plans, np.zeros(2, dtype=int), np.full(2, 1e-4),
                             np.full(2, 2e-4))
    assert forward[0] > 0
    assert got[1] - got[0] == pytest.approx(MIXTRAL.num_layers * forward[0])


def test_zero2_exposes_what_each_engine_exposes():
    """ZeRO-2 reduce-scatters every micro-batch's gradients. FSDP engines (FSDP2 reshard-never, FSDP1
    SHARD_GRAD_OP) gather and reduce beside each micro-batch's compute, per unit, so ZeRO-2 costs no more than
    ZeRO-3 (which gathers twice); DeepSpeed's ZeRO-2 has overlap_comm off, so each micro-batch's reduce-scatter and
    the step's gather are exposed whole."""
    dense = ModelSpec(name="dense-8b", hidden_size=4096, num_layers=32, num_attention_heads=32, num_kv_heads=8,
                      ffn_hidden_size=14336, vocab_size=128256, mlp=MlpKind.GATED)
    cluster = ClusterSpec(profile=H100, num_gpus=16, gpus_per_node=8)
    plans = PlanArrays.from_plans([Plan(zero=2, mbs=1), Plan(zero=3, mbs=1)])
    base = TrainingSpec(seq_len=4096, global_batch_size=128)
    titan = dataclasses.replace(base, engine="torchtitan")
    dp = steptime.step_time_terms_s(dense, cluster, titan, plans)["dp_comm"]
    assert dp[0] <= dp[1]
    deepspeed = dataclasses.replace(base, engine="deepspeed")
    reduce_s, gather_s, _, _ = steptime.dp_traffic_s(dense, cluster, plans, np.zeros(2, dtype=int))
    microbatches = 128 / 16
    got = steptime.step_time_terms_s(dense, cluster, deepspeed, plans)["dp_comm"][0]
    assert got == pytest.approx(microbatches * reduce_s[0] + gather_s[0], rel=1e-9)


def test_mla_gathers_its_latents_under_sequence_parallelism():
    """Megatron-Core's MLA runs the down projections on the sequence shard and gathers the q and kv latents and the
    rope key (1536 + 512 + 64 elements a token for DeepSeek-V3), not the 7168-wide hidden states."""
    from autopar.models import load_model

    v3 = load_model("deepseek-v3")
    cluster = ClusterSpec(profile=H100, num_gpus=8)
    plans = PlanArrays.from_plans([Plan(tp=4, sp=True), Plan(tp=4, sp=False)])
    training = TrainingSpec(seq_len=4096, global_batch_size=8)
    _, _, gather_s, _, _, _ = steptime.tp_block_s(v3, cluster, training, plans)
    group = comm.tp_group(plans, 8)
    latent_s = comm.group_collective_time_s(H100, group, "all_gather", 4096 * (1536 + 512 + 64) * 2.0)
    saving = steptime.mla_gather_saving_s(v3, cluster, training, plans, gather_s)
    assert saving[0] == pytest.approx(gather_s[0] - latent_s[0]) and saving[0] > 0
    assert saving[1] == 0.0
    titan = dataclasses.replace(training, engine="torchtitan")
    assert not steptime.mla_gather_saving_s(v3, cluster, titan, plans, gather_s).any()


def test_fsdp_engines_wait_for_the_last_reduce_scatter_after_every_backward():
    """FSDP1, FSDP2 and DeepSpeed's ZeRO-3 make the compute stream wait for the last reduce-scatter at the end of
    every micro-batch's backward; Megatron-FSDP only at the step's last."""
    compute_s, traffic_s, bucket_s = np.array([1.0]), np.array([0.5]), np.array([0.1])
    m = np.array([8.0])
    megatron = steptime.fsdp_microbatches_exposed_s(TrainingSpec(), compute_s, m, 0.0, traffic_s, bucket_s)
    titan = steptime.fsdp_microbatches_exposed_s(TrainingSpec(engine="torchtitan"), compute_s, m, 0.0, traffic_s,
                                                 bucket_s)
    assert megatron[0] == pytest.approx(0.1) and titan[0] == pytest.approx(8 * 0.1)
    assert steptime.waits_each_backward(TrainingSpec(engine="deepspeed"))
