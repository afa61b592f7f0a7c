"""The named rules (DESIGN.md §3): hand-checked plans, relaxation by name, and check_plan."""

from __future__ import annotations

import numpy as np
import pytest

import autopar
from costmodels.rules import (
    RULES,
    RULES_BY_ID,
    Problem,
    active_rules,
    check_plan,
    violated_rules,
)
from costmodels.errors import InputError
from costmodels.plan import Plan, PlanArrays, Recompute
from costmodels.specs import ModelSpec, MoESpec, TrainingSpec

DENSE = ModelSpec(name="dense", hidden_size=1024, num_layers=12, num_attention_heads=16, num_kv_heads=4,
                  ffn_hidden_size=4096, vocab_size=32000)
MOE = ModelSpec(name="moe", hidden_size=1024, num_layers=12, num_attention_heads=16, ffn_hidden_size=4096,
                vocab_size=32000, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=512))
CLUSTER = autopar.make_cluster(gpu="h100", num_gpus=64)
TRAIN = TrainingSpec(seq_len=4096, global_batch_size=128)


def broken(plan: Plan, model: ModelSpec = DENSE, cluster=CLUSTER, training=TRAIN, relax=()) -> tuple[str, ...]:
    ctx = Problem(model, cluster, training)
    return violated_rules(ctx, PlanArrays.from_plans([plan]), active_rules(relax))[0]


def test_every_rule_has_id_reason_source_and_knobs():
    ids = [r.id for r in RULES]
    assert ids == ["world", "heads", "layers", "experts", "tp_node", "cp_needs_sp_tp", "sp_needs_tp",
                   "moe_needs_sp", "cp_seq", "batch", "vpp", "zero_bubble_vpp", "zero_bubble_recompute",
                   "recompute", "fp8_delayed_recompute", "fp8_param_gather", "cuda_graph_recompute", "cpu_offloading",
                   "offload_inside_moe",
                   "memory"]
    for rule in RULES:
        assert rule.reason and rule.source and rule.knobs


def test_a_valid_plan_breaks_nothing():
    # 64 GPUs = tp 4 × cp 2 × pp 2 × dp 4; gbs 128 = dp 4 × mbs 2 × 16 microbatches; 12 layers = 2 stages × 2 vpp × 3
    assert broken(Plan(tp=4, cp=2, pp=2, vpp=2, mbs=2, sp=True)) == ()


@pytest.mark.parametrize("plan, rule", [
    (Plan(tp=3), "world"),                                  # 64 % 3 != 0
    (Plan(tp=8), "heads"),                                  # 4 KV heads % 8 != 0
    (Plan(pp=8), "layers"),                                 # 12 layers / 8 stages is not whole
    (Plan(pp=2, vpp=4), "layers"),                          # 6 layers per stage / 4 chunks
    (Plan(tp=2, cp=2, sp=False), "cp_needs_sp_tp"),         # guide: CP needs SP and TP
    (Plan(sp=True), "sp_needs_tp"),                         # SP on tp = 1
    (Plan(mbs=3), "batch"),                                 # dp 64 × mbs 3 does not divide 128
    (Plan(pp=2, vpp=2, mbs=2), "batch"),                    # dp 32 × mbs 2 = 64: 2 microbatches % pp 2 ok ...
    (Plan(recompute=Recompute.SELECTIVE, recompute_layers=2), "recompute"),
])
def test_each_rule_rejects_its_case(plan, rule):
    if plan == Plan(pp=2, vpp=2, mbs=2):
        # ... but with gbs 64 there is 1 microbatch, not a multiple of pp 2 for the interleaved schedule
        assert rule in broken(plan, training=TrainingSpec(seq_len=4096, global_batch_size=64))
        return
    assert rule in broken(plan)


@pytest.mark.parametrize("group, gbs, holds", [
    # 64 GPUs at tp 2 pp 4 mbs 1: dp 8, so m = gbs / 8 micro-batches, interleaved in groups of g (Megatron-Core
    # schedules.py: pp <= g <= m, and a last group of 0 or at least pp)
    (0, 128, True),         # g = pp = 4, m = 16
    (0, 80, False),         # m = 10: not a multiple of pp
    (8, 128, True),         # m = 16 = 2 groups of 8
    (8, 96, True),          # m = 12: 8 + 4, the last group = pp
    (8, 80, False),         # m = 10: 8 + 2, the last group under pp (RuntimeError)
    (16, 64, False),        # g 16 > m 8 (ValueError)
    (2, 128, False),        # g 2 < pp 4 (ValueError)
])
def test_interleaving_takes_the_micro_batch_group_megatron_core_accepts(group, gbs, holds):
    training = TrainingSpec(seq_len=4096, global_batch_size=gbs, microbatch_group_size_per_vp_stage=group)
    plan = Plan(tp=2, pp=4, vpp=3, mbs=1, sp=True)
    assert ("batch" not in broken(plan, training=training)) is holds
    assert "batch" not in broken(Plan(tp=2, pp=4, mbs=1, sp=True), training=training)   # not interleaved: no groups
    if not holds:
        why = RULES_BY_ID["batch"].why_broken(Problem(DENSE, CLUSTER, training), plan)
        assert ("groups of" in why) if group else ("divisible by pp=4" in why)


def test_uneven_stages():
    # 12 layers on pp 4: first 2, last 1, middle (12 - 3) / 2 = 4.5 -> invalid; first 2, last 2 -> middle 4
    assert "layers" in broken(Plan(pp=4, first_stage_layers=2, last_stage_layers=1, mbs=1))
    assert "layers" not in broken(Plan(pp=4, first_stage_layers=2, last_stage_layers=2))
    # first only: (12 - 3) / 3 = 3 per other stage
    assert "layers" not in broken(Plan(pp=4, first_stage_layers=3))
    # explicit ends mean nothing without a pipeline
    assert "layers" in broken(Plan(first_stage_layers=3))


def test_tp_node_and_relaxing_it():
    cluster = autopar.make_cluster(gpu="h100", num_gpus=64)
    wide = ModelSpec(name="wide", hidden_size=2048, num_layers=4, num_attention_heads=16, ffn_hidden_size=8192,
                     vocab_size=1000)
    assert "tp_node" in broken(Plan(tp=16), wide, cluster)          # 16 > 8 GPUs per node
    assert "tp_node" not in broken(Plan(tp=16), wide, cluster, relax=("tp_node",))


def test_end_stages_that_count_the_embedding_or_loss_interleave():
    # Megatron-Core --account-for-embedding/loss-in-pipeline-split: 126 layers + 2 slots = 8 per rank on pp 16, so
    # ends of 7 layers interleave with vpp 2, 4 or 8; an end of 6 does not, nor a slot end beside an explicit other
    deep = ModelSpec(name="deep", hidden_size=1024, num_layers=126, num_attention_heads=16, ffn_hidden_size=4096,
                     vocab_size=32000)
    cluster = autopar.make_cluster(gpu="h100", num_gpus=128)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    for vpp in (2, 4, 8):
        assert "layers" not in broken(Plan(pp=16, vpp=vpp, first_stage_layers=7, last_stage_layers=7), deep,
                                      cluster, training)
    assert "layers" not in broken(Plan(pp=16, vpp=2, first_stage_layers=0, last_stage_layers=6), deep, cluster,
                                  training)                          # 6 % 2 == 0: an ordinary uneven split
    assert "layers" in broken(Plan(pp=16, vpp=4, first_stage_layers=6, last_stage_layers=0), deep, cluster, training)
    toy = ModelSpec(name="toy", hidden_size=1024, num_layers=29, num_attention_heads=16, ffn_hidden_size=4096,
                    vocab_size=32000)                                # pp 4: 8 + 8 in the middle, 7 + 6 at the ends
    mixed = Plan(pp=4, vpp=2, first_stage_layers=7, last_stage_layers=6)
    assert "layers" in broken(mixed, toy, cluster, training)
    assert "cannot be combined" in RULES_BY_ID["layers"].why_broken(Problem(toy, cluster, training), mixed)


def test_experts_rule():
    assert "experts" in broken(Plan(ep=3), MOE)                     # 8 experts % 3
    assert "experts" not in broken(Plan(ep=4, tp=1, etp=1), MOE)
    assert "experts" in broken(Plan(ep=2), DENSE)                   # a dense model has no experts


def test_expert_tp_messages_name_etp():
    # etp alone breaks the rule: the message names etp and its fix, not the rule's generic reason
    ctx = Problem(DENSE, CLUSTER, TRAIN)
    dense_etp = Plan(tp=2, sp=True, etp=4)
    assert "experts" in broken(dense_etp)
    assert RULES_BY_ID["experts"].why_broken(ctx, dense_etp) == \
        "etp=4 must equal tp=2: dense is dense (no expert layers); drop --etp"
    wide_etp = Plan(tp=2, sp=True, ep=2, etp=16)
    assert "tp_node" in broken(wide_etp, MOE)
    assert RULES_BY_ID["tp_node"].why_broken(Problem(MOE, CLUSTER, TRAIN), wide_etp).startswith(
        "etp=16 must divide gpus_per_node=8")


def test_unknown_or_required_rule_cannot_be_relaxed():
    with pytest.raises(InputError, match="tp_node, cp_needs_sp_tp"):
        active_rules(["no_such_rule"])
    with pytest.raises(InputError, match="cannot be relaxed"):
        active_rules(["world"])
    assert "cp_needs_sp_tp" not in [r.id for r in active_rules(["cp_needs_sp_tp"])]


def test_check_plan_names_memory():
    big = autopar.load_model("llama-3.1-70b")
    one = autopar.make_cluster(gpu="a100-80gb", num_gpus=8)
    # 70B on one 8-GPU node at tp 8: weights + grads + Adam alone are 70e9 × 18 / 8 ≈ 147 GiB per GPU > 64 GiB
    assert check_plan(big, one, TRAIN, Plan(tp=8, sp=True)) == ("memory",)
    assert check_plan(big, autopar.make_cluster(gpu="a100-80gb", num_gpus=64), TRAIN,
                      Plan(tp=8, pp=8, sp=True, zero=1, recompute=Recompute.FULL)) == ()


def test_rules_are_vectorised():
    plans = PlanArrays.from_plans([Plan(), Plan(tp=3), Plan(sp=True)])
    mask = RULES_BY_ID["world"].holds(Problem(DENSE, CLUSTER, TRAIN), plans)
    assert mask.dtype == np.bool_ and list(mask) == [True, False, True]


def test_interleaving_without_the_p2p_overlap_needs_more_than_two_stages():
    """Megatron-LM validate_args: without overlap_p2p_comm the interleaved schedule asserts pp > 2."""
    blocking = TrainingSpec(seq_len=4096, global_batch_size=128, overlap_p2p_comm=False)
    plan = Plan(tp=4, cp=2, pp=2, vpp=2, mbs=2, sp=True)
    assert broken(plan) == () and broken(plan, training=blocking) == ("vpp",)
    assert "drop --no-overlap-p2p-communication" in RULES_BY_ID["vpp"].why_broken(Problem(DENSE, CLUSTER, blocking),
                                                                                plan)
    # 12 layers on pp 3 × vpp 2 (2 per chunk): allowed either way
    assert "vpp" not in broken(Plan(tp=4, pp=3, vpp=2, mbs=1, sp=True), cluster=autopar.make_cluster(
        gpu="h100", num_gpus=48), training=blocking)


def test_per_layer_cuda_graphs_refuse_full_recompute():
    """Megatron-Core's TransformerConfig refuses full recompute under per-layer CUDA graphs ('full recompute is only
    supported with full iteration CUDA graph'); selective recompute, or no graphs, passes."""
    graphs = TrainingSpec(seq_len=4096, global_batch_size=128, launch="cuda_graph", cuda_graph_modules=("attn",))
    full = Plan(tp=8, pp=2, mbs=1, sp=True, recompute=Recompute.FULL, zero=1)
    selective = Plan(tp=8, pp=2, mbs=1, sp=True, recompute=Recompute.SELECTIVE, zero=1)
    assert "cuda_graph_recompute" in broken(full, training=graphs)
    assert "cuda_graph_recompute" not in broken(selective, training=graphs)
    assert "cuda_graph_recompute" not in broken(full)
    whole_iteration = TrainingSpec(seq_len=4096, global_batch_size=128, launch="cuda_graph",
                                   cuda_graph_full_iteration=True)
    assert "cuda_graph_recompute" not in broken(full, training=whole_iteration)
    with pytest.raises(InputError, match="cuda_graph_full_iteration"):
        TrainingSpec(launch="cuda_graph", cuda_graph_modules=("attn",), cuda_graph_full_iteration=True)
    message = RULES_BY_ID["cuda_graph_recompute"].why_broken(Problem(DENSE, CLUSTER, graphs), full)
    assert "full iteration CUDA graph" in message and "--cuda-graph-impl" in message
