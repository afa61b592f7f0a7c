"""Issue 43, second pass: the memory switches the frameworks' performance recipes set, priced as terms of
costmodels.memory with hand-derived arithmetic, their readers (autopar.bridge_config, autopar.megatron_args), the
Llama 3 presets the Llama 3 recipes name, and what Bridge's performance launcher changes before it trains
(benchmarks/bridge_recipes.launcher_overrides).

Shapes used below (autopar/presets):
- qwen3-30b-a3b: h = 2048, 48 layers, all MoE (128 experts, top 8, expert width F_e = 768, gated);
- llama-3-8b: h = 4096, 32 layers, 32 heads (8 KV), F = 14336, vocab 128256, untied.
"""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

import autopar
from autopar.bridge_config import read_bridge_config
from autopar.megatron_args import parse_megatron_args
from benchmarks.bridge_recipes import launcher_overrides
from costmodels import memory, params
from costmodels.errors import InputError
from costmodels.plan import Plan, PlanArrays, Recompute, RecomputeModule
from costmodels.rules import RULES_BY_ID, Problem
from costmodels.specs import TrainingSpec


def terms(model_name: str, num_gpus: int, training: TrainingSpec, plan: Plan, stage: int = 0,
          gpu: str = "h100") -> dict[str, float]:
    model = autopar.load_model(model_name)
    cluster = autopar.make_cluster(gpu=gpu, num_gpus=num_gpus)
    out = memory.memory_terms_bytes(model, cluster, training, PlanArrays.from_plans([plan]), stage)
    return {name: float(value[0]) for name, value in out.items()}


# ---- MoE: the flex dispatcher's rank budget and the paged stash ---------------------------------------------------

QWEN_MOE = Plan(tp=1, pp=1, ep=8, etp=1, mbs=1, zero=1)
COPIES = 4096 * 8               # T·k·etp/t: 4096 tokens, top 8, etp 1, tp 1
PER_COPY = 2 * 2048 + (2 * 2 + 2) * 768   # bf16 expert input 2h, gated MLP: [gate, up] 2·2F_e and fc2 input 2F_e


def test_a_rank_budget_sizes_the_expert_buffers():
    base = TrainingSpec(seq_len=4096, global_batch_size=64, moe_dispatcher="deepep")
    dropless = terms("qwen3-30b-a3b", 64, base, QWEN_MOE)
    # 48 MoE layers × 32768 copies × 8704 bytes (one micro-batch in flight: pp 1)
    assert dropless["expert_mlp_activations"] == pytest.approx(48 * COPIES * PER_COPY)
    assert dropless["moe_dispatch_activations"] == pytest.approx(48 * COPIES * 4)      # fp32 routing weight a copy
    budget = terms("qwen3-30b-a3b", 64, TrainingSpec(seq_len=4096, global_batch_size=64, moe_dispatcher="deepep",
                                                      moe_rank_capacity_factor=1.5), QWEN_MOE)
    # HybridEP's static buffers: num_tokens · top_k · 1.5 rows, whatever the routing
    assert budget["expert_mlp_activations"] == pytest.approx(1.5 * 48 * COPIES * PER_COPY)
    assert budget["moe_dispatch_activations"] == pytest.approx(1.5 * 48 * COPIES * 4)
    assert "moe_stash_working_set" not in budget


def test_the_paged_stash_holds_its_factor_of_the_expected_tokens_and_one_layer_at_the_budget():
    training = TrainingSpec(seq_len=4096, global_batch_size=64, moe_dispatcher="deepep",
                            moe_rank_capacity_factor=1.5, moe_paged_stash_factor=1.2)
    stash = terms("qwen3-30b-a3b", 64, training, QWEN_MOE)
    # the stash: 1.2 × the expected rows (budget / 1.5) of every layer-micro-batch in flight
    assert stash["expert_mlp_activations"] == pytest.approx(1.2 * 48 * COPIES * PER_COPY)
    # the layer being computed holds its tensors at the budget's length beside the stash
    assert stash["moe_stash_working_set"] == pytest.approx(1.5 * COPIES * PER_COPY)
    # moe_act recompute drops the fc2 input (2 bytes × F_e a copy) from both
    act = terms("qwen3-30b-a3b", 64, training, Plan(tp=1, pp=1, ep=8, etp=1, mbs=1, zero=1,
                                                   recompute=Recompute.SELECTIVE, recompute_modules="moe_act"))
    kept = PER_COPY - 2 * 768
    assert act["expert_mlp_activations"] == pytest.approx(1.2 * 48 * COPIES * kept)
    assert act["moe_stash_working_set"] == pytest.approx(1.5 * COPIES * kept)


def test_stash_and_budget_are_checked_as_megatron_core_checks_them():
    with pytest.raises(InputError, match="needs a rank capacity factor"):
        TrainingSpec(moe_dispatcher="deepep", moe_paged_stash_factor=1.1)
    with pytest.raises(InputError, match="flex dispatcher"):
        TrainingSpec(moe_rank_capacity_factor=1.5)
    with pytest.raises(InputError, match="must be > 0"):
        TrainingSpec(moe_dispatcher="deepep", moe_rank_capacity_factor=0.0)


def test_the_a2a_overlap_warms_up_one_chunk_micro_batch_more():
    """pp 4, vpp 2, rank 0: W = (4 - 0 - 1)·2 + (2 - 1)·4 = 10, held N = W + 1 = 11 chunk-micro-batches = 5.5
    whole-rank micro-batches; with overlap_moe_expert_parallel_comm W = 11, N = 12 -> 6 (get_pp_rank_microbatches)."""
    plans = PlanArrays.from_plans([Plan(pp=4, vpp=2)])
    stage = np.zeros(1)
    assert memory.in_flight_microbatches(plans, stage, np.array([64.0]))[0] == pytest.approx(5.5)
    assert memory.in_flight_microbatches(plans, stage, np.array([64.0]), moe_a2a_overlap=True)[0] == 6.0
    # plain 1F1B (vpp 1) has no extra warm-up: pp - r
    one = PlanArrays.from_plans([Plan(pp=4)])
    assert memory.in_flight_microbatches(one, stage, np.array([64.0]), moe_a2a_overlap=True)[0] == 4.0


# ---- CPU activation offloading --------------------------------------------------------------------------------

def test_cpu_offloading_keeps_the_other_layers_activations_on_the_gpu():
    """Transformer Engine keeps at most model_layers - num_layers layers' activations on the GPU: 20 of llama-3-8b's
    32 layers offloaded leave 12 of 32."""
    plan = Plan(tp=1, pp=1, mbs=1, zero=1)
    base = TrainingSpec(seq_len=4096, global_batch_size=64)
    full = terms("llama-3-8b", 64, base, plan)["layer_activations"]
    offloaded = terms("llama-3-8b", 64, TrainingSpec(seq_len=4096, global_batch_size=64, cpu_offload_layers=20),
                      plan)["layer_activations"]
    assert offloaded == pytest.approx(full * 12 / 32)


def test_cpu_offloading_rule():
    model = autopar.load_model("llama-3-8b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=64)
    rule = RULES_BY_ID["cpu_offloading"]
    problem = Problem(model, cluster, TrainingSpec(cpu_offload_layers=20))
    plans = [Plan(pp=1), Plan(pp=2), Plan(pp=1, recompute=Recompute.SELECTIVE)]
    assert rule.holds(problem, PlanArrays.from_plans(plans)).tolist() == [True, False, False]
    assert "no support for Pipeline parallelism" in rule.why_broken(problem, plans[1])
    assert "activation recomputation" in rule.why_broken(problem, plans[2])
    every = Problem(model, cluster, TrainingSpec(cpu_offload_layers=32))
    assert not rule.holds(every, PlanArrays.from_plans([Plan(pp=1)]))[0]
    assert "layers less than" in rule.why_broken(every, Plan(pp=1))
    assert rule.holds(Problem(model, cluster, TrainingSpec()), PlanArrays.from_plans(plans)).all()


# ---- fine-grained activation offloading ---------------------------------------------------------------------------

def test_offloading_the_attention_core_and_projection_leaves_two_layers_of_it():
    """llama-3-8b, tp 1 pp 1 mbs 1, seq 4096 (one micro-batch in flight, 32 layers held). core_attn offloads Q, K, V
    (2 bytes × (4096 + 1024 + 1024) per token) and the kernel's log-sum-exp (4 bytes × 32 heads); attn_proj the
    projection's input (2 × 4096): 84,410,368 bytes a layer. All but OFFLOAD_RESIDENT_LAYERS (2) of the 32 go to the
    host."""
    plan = Plan(tp=1, pp=1, mbs=1, zero=1)
    full = terms("llama-3-8b", 64, TrainingSpec(seq_len=4096, global_batch_size=64), plan)
    offloaded = terms("llama-3-8b", 64, TrainingSpec(seq_len=4096, global_batch_size=64,
                                                     offload_modules=("core_attn", "attn_proj")), plan)
    per_layer = (2 * (4096 + 1024 + 1024) + 4 * 32) * 4096 + 2 * 4096 * 4096
    assert per_layer == 84_410_368
    assert full["layer_activations"] - offloaded["layer_activations"] == pytest.approx(30 * per_layer)
    # the fused input norm of a dense layer is IdentityOp in the layer: attn_norm and mlp_norm offload nothing
    norms = terms("llama-3-8b", 64, TrainingSpec(seq_len=4096, global_batch_size=64,
                                                 offload_modules=("attn_norm", "mlp_norm")), plan)
    assert norms["layer_activations"] == full["layer_activations"]


def test_offloading_the_routed_experts_and_the_moe_norm():
    """qwen3-30b-a3b, tp 1 ep 8, mbs 1, seq 4096: 32,768 token copies per MoE layer (4096 tokens × top 8). expert_fc1
    offloads each copy's input (2 × 2048 bytes), moe_act the activation's input (2 × 2 × 768, gated); mlp_norm the
    pre-MLP norm's input and rstd ((2 × 2048 + 4) × 4096 tokens). 46 of the 48 layers' worth leave the GPU."""
    base = TrainingSpec(seq_len=4096, global_batch_size=64)
    full = terms("qwen3-30b-a3b", 64, base, QWEN_MOE)
    offloaded = terms("qwen3-30b-a3b", 64, TrainingSpec(seq_len=4096, global_batch_size=64,
                                                        offload_modules=("mlp_norm", "expert_fc1", "moe_act")),
                      QWEN_MOE)
    assert full["expert_mlp_activations"] - offloaded["expert_mlp_activations"] == pytest.approx(
        46 * COPIES * (2 * 2048 + 2 * 2 * 768))
    assert full["layer_activations"] - offloaded["layer_activations"] == pytest.approx(
        46 * (2 * 2048 + 4) * 4096)
    # fused_group_mlp takes everything the routed MLP keeps per copy (its input, the activation's input and output)
    fused = terms("qwen3-30b-a3b", 64, TrainingSpec(seq_len=4096, global_batch_size=64,
                                                    offload_modules=("fused_group_mlp",)), QWEN_MOE)
    assert fused["expert_mlp_activations"] == pytest.approx(full["expert_mlp_activations"] * 2 / 48)


def test_offload_copies_cost_what_the_layers_do_not_hide():
    """llama-3-8b, tp 1 pp 1 mbs 1, seq 4096, gbs 64 on 64 GPUs (1 micro-batch), core_attn + attn_proj: 84,410,368
    bytes a layer each way. At the H100's 64 GB/s (PCIe Gen5 x16) that is 1.32 ms, under the layer's forward: no
    cost. Over a 1 GB/s host link each of the 32 layers waits 84.4 ms − f out and 84.4 ms − 2f back, f its
    forward; the term exists only where something is offloaded."""
    from costmodels import compute, steptime

    model = autopar.load_model("llama-3-8b")
    plan = PlanArrays.from_plans([Plan(tp=1, pp=1, mbs=1, zero=1)])
    training = TrainingSpec(seq_len=4096, global_batch_size=64, offload_modules=("core_attn", "attn_proj"))
    cluster = autopar.make_cluster(gpu="h100", num_gpus=64)
    assert cluster.profile.host_link_bytes_per_s == 64e9
    assert steptime.step_time_terms_s(model, cluster, training, plan)["offload_copies"][0] == 0.0
    assert "offload_copies" not in steptime.step_time_terms_s(model, cluster, TrainingSpec(seq_len=4096,
                                                                                          global_batch_size=64), plan)
    slow = dataclasses.replace(cluster, profile=dataclasses.replace(cluster.profile, host_link_bytes_per_s=1e9))
    forward = compute.layer_times_s(model, slow.profile, training, plan).dense_layer_fwd_s[0]
    copy = 84_410_368 / 1e9
    assert copy > 2 * forward
    terms = steptime.step_time_terms_s(model, slow, training, plan)
    assert terms["offload_copies"][0] == pytest.approx(32 * (copy - forward + copy - 2 * forward))
    unknown = dataclasses.replace(cluster, profile=dataclasses.replace(cluster.profile, host_link_bytes_per_s=0.0))
    assert steptime.step_time_terms_s(model, unknown, training, plan)["offload_copies"][0] == 0.0


def test_an_offload_fraction_offloads_that_share():
    """--activation-offload-fraction 0.25 leaves the later three quarters of each chunk's groups on the GPU: a
    quarter of what core_attn + attn_proj move (the 84,410,368 bytes a layer of the test above) leaves, but for the
    two resident layers' worth."""
    plan = Plan(tp=1, pp=1, mbs=1, zero=1)
    full = terms("llama-3-8b", 64, TrainingSpec(seq_len=4096, global_batch_size=64), plan)
    quarter = terms("llama-3-8b", 64, TrainingSpec(seq_len=4096, global_batch_size=64, offload_fraction=0.25,
                                                   offload_modules=("core_attn", "attn_proj")), plan)
    assert full["layer_activations"] - quarter["layer_activations"] == pytest.approx(30 * 0.25 * 84_410_368)
    for bad in (1.5, -0.1, True):
        with pytest.raises(InputError, match="offload_fraction"):
            TrainingSpec(offload_modules=("core_attn",), offload_fraction=bad)
    with pytest.raises(InputError, match="add --offload-modules"):
        TrainingSpec(offload_fraction=0.5)


def test_offload_modules_are_checked_as_megatron_core_checks_them():
    TrainingSpec(offload_modules=["moe_act", "core_attn"])             # any order: kept in OFFLOAD_MODULES's
    assert TrainingSpec(offload_modules=["moe_act", "core_attn"]).offload_modules == ("core_attn", "moe_act")
    for bad, message in (({"offload_modules": ("attn_proj",)}, "add core_attn"),
                         ({"offload_modules": ("fused_group_mlp", "moe_act")}, "fused_group_mlp"),
                         ({"offload_modules": ("router",)}, "must name modules among"),
                         ({"offload_modules": ("core_attn",), "cpu_offload_layers": 4}, "cpu_offloading"),
                         ({"offload_modules": ("core_attn",), "engine": "torchtitan"}, "Megatron-Core's")):
        with pytest.raises(InputError, match=message):
            TrainingSpec(**bad)
    model = autopar.load_model("qwen3-30b-a3b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=64)
    rule = RULES_BY_ID["offload_inside_moe"]
    problem = Problem(model, cluster, TrainingSpec(offload_modules=("expert_fc1",)))
    plans = [Plan(ep=8, recompute=Recompute.SELECTIVE, recompute_modules=RecomputeModule.MOE),
             Plan(ep=8, recompute=Recompute.SELECTIVE, recompute_modules=RecomputeModule.MOE_ACT)]
    assert rule.holds(problem, PlanArrays.from_plans(plans)).tolist() == [False, True]
    assert "recomputing the entire MoE layer" in rule.why_broken(problem, plans[0])
    attention_only = Problem(model, cluster, TrainingSpec(offload_modules=("core_attn",)))
    assert rule.holds(attention_only, PlanArrays.from_plans(plans)).all()


def test_the_readers_take_fine_grained_offloading():
    """Megatron-LM's flags as its fine-grained offloading guide writes them
    (docs/user-guide/features/fine_grained_activation_offloading.md) and Bridge's TransformerConfig fields."""
    run = parse_megatron_args("--bf16 --micro-batch-size 1 --num-experts 8 --fine-grained-activation-offloading "
                              "--offload-modules core_attn attn_proj expert_fc1 --activation-offload-fraction 0.8 "
                              "--delta-offload-bytes-across-pp-ranks 1073741824")
    assert run.training["offload_modules"] == ("core_attn", "attn_proj", "expert_fc1")
    assert run.training["offload_fraction"] == 0.8
    assert any(note.startswith("--delta-offload-bytes-across-pp-ranks 1073741824") for note in run.notes)
    with pytest.raises(InputError, match="not a probability"):
        parse_megatron_args("--bf16 --fine-grained-activation-offloading --offload-modules core_attn "
                            "--activation-offload-fraction 1.5")
    assert "offload_modules" not in parse_megatron_args("--bf16 --offload-modules core_attn").training
    with pytest.raises(InputError, match="without --offload-modules"):
        parse_megatron_args("--bf16 --fine-grained-activation-offloading")
    with pytest.raises(InputError, match="--offload-modules router"):
        parse_megatron_args("--bf16 --fine-grained-activation-offloading --offload-modules router")
    config = {"model": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "num_layers": 48,
                        "fine_grained_activation_offloading": True, "offload_modules": ["expert_fc1"],
                        "activation_offload_fraction": 0.5},
              "train": {"micro_batch_size": 1, "global_batch_size": 64}}
    bridge = read_bridge_config(config)
    assert bridge.training["offload_modules"] == ("expert_fc1",) and bridge.training["offload_fraction"] == 0.5
    assert not any("offload" in switch or "fine_grained" in switch for switch in bridge.not_priced)
    off = {**config, "model": {**config["model"], "fine_grained_activation_offloading": False}}
    assert "offload_modules" not in read_bridge_config(off).training


def test_an_offloading_estimate_exports_the_offloading_it_priced():
    """The Megatron-LM command of an estimate with offload modules turns the offloading on, so the launched run holds
    what was priced; read back, it gives the same modules. Bridge, NeMo and verl write the TransformerConfig fields."""
    from autopar.export import launch_config
    from costmodels.scoring import estimate

    model = autopar.load_model("qwen3-30b-a3b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=16)
    training = TrainingSpec(seq_len=4096, global_batch_size=64, offload_fraction=0.5,
                            offload_modules=("core_attn", "attn_proj", "expert_fc1"))
    priced = estimate(model, cluster, training, Plan(tp=1, pp=1, ep=8, etp=1, mbs=1, zero=1))
    command = launch_config(priced, "megatron").text
    assert "--fine-grained-activation-offloading" in command
    read_back = parse_megatron_args(command).training
    assert read_back["offload_modules"] == training.offload_modules and read_back["offload_fraction"] == 0.5
    for framework in ("bridge", "verl"):
        text = launch_config(priced, framework).text
        assert "fine_grained_activation_offloading=" in text and "activation_offload_fraction=0.5" in text, framework
    # NeMo 2.7.3's megatron-core 0.16.1 has no activation_offload_fraction: refused, naming the input, no nearest plan
    from autopar.export.capabilities import Unsupported

    with pytest.raises(Unsupported, match="no activation_offload_fraction") as refused:
        launch_config(priced, "nemo")
    assert refused.value.with_nearest(priced) is refused.value
    whole = estimate(model, cluster, dataclasses.replace(training, offload_fraction=1.0),
                     Plan(tp=1, pp=1, ep=8, etp=1, mbs=1, zero=1))
    text = launch_config(whole, "nemo").text
    assert "fine_grained_activation_offloading=" in text and "activation_offload_fraction" not in text
    plain = estimate(model, cluster, TrainingSpec(seq_len=4096, global_batch_size=64),
                     Plan(tp=1, pp=1, ep=8, etp=1, mbs=1, zero=1))
    assert "offload" not in launch_config(plain, "megatron").text


def test_cuda_graphs_keep_the_norms_on_the_gpu():
    """Megatron-Core turns attn_norm and mlp_norm offloading off under per-layer CUDA graphs (they cross the graphs'
    boundaries): a MoE layer's pre-MLP norm stays."""
    plan = QWEN_MOE
    eager = terms("qwen3-30b-a3b", 64, TrainingSpec(seq_len=4096, global_batch_size=64,
                                                    offload_modules=("mlp_norm",)), plan)
    graphed = terms("qwen3-30b-a3b", 64, TrainingSpec(seq_len=4096, global_batch_size=64, launch="cuda_graph",
                                                      offload_modules=("mlp_norm",)), plan)
    graphed_plain = terms("qwen3-30b-a3b", 64, TrainingSpec(seq_len=4096, global_batch_size=64, launch="cuda_graph"),
                          plan)
    assert graphed["layer_activations"] == graphed_plain["layer_activations"] > eager["layer_activations"]


LLAMA_PIPE = Plan(tp=1, pp=4, vpp=2, mbs=1, zero=1)   # llama-3-8b: 32 layers, 8 a rank, 4 a virtual stage


def test_transformer_engine_graphs_keep_an_attention_mask_per_layer_forward_in_flight():
    """TransformerLayer.get_layer_static_inputs adds a bool (mbs, 1, s/cp, s) mask to every captured sample, and
    the samples are reused only after their backward: on rank 0 of pp 4 vpp 2 with 16 micro-batches, 2·3 + 1·4
    warmup chunk-forwards + 1 = 11 chunks of 4 layers are in flight, 44 masks of 4096 × 4096 bytes."""
    graphs = TrainingSpec(seq_len=4096, global_batch_size=16, launch="cuda_graph")
    graphed = terms("llama-3-8b", 4, graphs, LLAMA_PIPE)
    assert graphed["cuda_graph_attention_masks"] == pytest.approx(44 * 4096 * 4096)
    last = terms("llama-3-8b", 4, graphs, LLAMA_PIPE, stage=3)      # 2·0 + 4 + 1 = 5 chunks
    assert last["cuda_graph_attention_masks"] == pytest.approx(5 * 4 * 4096 * 4096)
    # pp 1 captures one micro-batch and replays it: one mask a layer; cp 2 halves each mask's rows
    single = terms("llama-3-8b", 2, graphs, Plan(tp=1, pp=1, cp=2, mbs=2, zero=1))
    assert single["cuda_graph_attention_masks"] == pytest.approx(32 * 2 * 2048 * 4096)
    # nothing where no mask is captured: local capture, attention not captured, the whole iteration, eager
    for training in (dataclasses.replace(graphs, cuda_graph_impl="local"),
                     dataclasses.replace(graphs, cuda_graph_modules=("mlp",)),
                     dataclasses.replace(graphs, cuda_graph_full_iteration=True),
                     TrainingSpec(seq_len=4096, global_batch_size=16)):
        assert "cuda_graph_attention_masks" not in terms("llama-3-8b", 4, training, LLAMA_PIPE)
    eager = terms("llama-3-8b", 4, TrainingSpec(seq_len=4096, global_batch_size=16), LLAMA_PIPE)
    assert sum(graphed.values()) - sum(eager.values()) == pytest.approx(44 * 4096 * 4096)
    # the attention among other captured modules; tensor and sequence parallelism leave the mask whole
    scoped = dataclasses.replace(graphs, cuda_graph_modules=("attn", "mlp"))
    assert terms("llama-3-8b", 4, scoped, LLAMA_PIPE)["cuda_graph_attention_masks"] == pytest.approx(44 * 4096 * 4096)
    split = terms("llama-3-8b", 8, graphs, dataclasses.replace(LLAMA_PIPE, tp=2, sp=True))
    assert split["cuda_graph_attention_masks"] == pytest.approx(44 * 4096 * 4096)
    with pytest.raises(InputError, match="cuda_graph_impl"):
        dataclasses.replace(graphs, cuda_graph_impl="full_iteration")


def test_under_the_ep_overlap_the_graphs_hold_one_layer_more_not_one_chunk():
    """TECudaGraphHelper orders its capture without the EP overlap's extra warm-up chunk, but runs forward and
    backward layer by layer: qwen3-30b-a3b on pp 4 vpp 2 (6 layers a chunk), 16 micro-batches: rank 0 holds
    2·3 + 4 + 1 = 11 chunks, 66 layer-forwards, one more under the overlap (the activations: one chunk more)."""
    plan = Plan(tp=1, pp=4, vpp=2, ep=8, etp=1, mbs=1, zero=1)
    graphs = TrainingSpec(seq_len=4096, global_batch_size=128, launch="cuda_graph",
                          cuda_graph_modules=("attn", "moe_router", "moe_preprocess"))
    mask = 4096 * 4096
    assert terms("qwen3-30b-a3b", 32, graphs, plan)["cuda_graph_attention_masks"] == pytest.approx(66 * mask)
    overlap = dataclasses.replace(graphs, moe_a2a_overlap=True)
    assert terms("qwen3-30b-a3b", 32, overlap, plan)["cuda_graph_attention_masks"] == pytest.approx(67 * mask)
    assert terms("qwen3-30b-a3b", 32, overlap, plan, stage=3)["cuda_graph_attention_masks"] == \
        pytest.approx((5 * 6 + 1) * mask)


def test_a_whole_iteration_graph_keeps_every_micro_batch_the_loader_gave():
    """FullCudaGraphWrapper.data_read copies each of the step's micro-batches into StaticBufferLoader's buffers, on
    the ranks that read data (first and last): llama-3-8b pp 4, 16 micro-batches of 1 × 4096 tokens, each 28 bytes
    a token (int64 tokens, labels, position ids, fp32 loss mask) and, from the loader's default, a 4096 × 4096 bool
    mask; the middle ranks hold none, and nothing is kept without the whole-iteration capture."""
    whole = TrainingSpec(seq_len=4096, global_batch_size=16, launch="cuda_graph", cuda_graph_full_iteration=True)
    per_sample = 4096 * 28 + 4096 * 4096
    assert terms("llama-3-8b", 4, whole, LLAMA_PIPE)["cuda_graph_loader_batches"] == pytest.approx(16 * per_sample)
    assert terms("llama-3-8b", 4, whole, LLAMA_PIPE, stage=3)["cuda_graph_loader_batches"] == \
        pytest.approx(16 * per_sample)
    assert terms("llama-3-8b", 4, whole, LLAMA_PIPE, stage=1)["cuda_graph_loader_batches"] == 0
    no_mask = dataclasses.replace(whole, dataloader_attention_mask=False)
    assert terms("llama-3-8b", 4, no_mask, LLAMA_PIPE)["cuda_graph_loader_batches"] == pytest.approx(16 * 4096 * 28)
    assert "cuda_graph_loader_batches" not in terms("llama-3-8b", 4, dataclasses.replace(
        whole, cuda_graph_full_iteration=False), LLAMA_PIPE)
    assert parse_megatron_args("--bf16 --no-create-attention-mask-in-dataloader").training[
        "dataloader_attention_mask"] is False
    assert parse_megatron_args("--bf16 --dataloader-inter-document-masking").training[
        "dataloader_attention_mask"] is False
    bridge = read_bridge_config({"model": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                                           "num_layers": 32}, "dataset": {"create_attention_mask": False},
                                 "train": {"micro_batch_size": 1, "global_batch_size": 64}}).training
    assert bridge["dataloader_attention_mask"] is False and bridge["dataloader_on_every_rank"] is True
    # Megatron-Bridge builds the dataset on every rank (data/utils.py): the middle ranks keep the batches too
    everywhere = dataclasses.replace(whole, dataloader_on_every_rank=True)
    assert terms("llama-3-8b", 4, everywhere, LLAMA_PIPE, stage=1)["cuda_graph_loader_batches"] == \
        pytest.approx(16 * per_sample)


def test_the_exports_write_the_loader_mask_as_priced():
    """An estimate priced without the loader's masks launches without them."""
    from autopar.export import launch_config
    from costmodels.scoring import estimate

    model = autopar.load_model("llama-3-8b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=4)
    training = TrainingSpec(seq_len=4096, global_batch_size=16, launch="cuda_graph", cuda_graph_full_iteration=True,
                            dataloader_attention_mask=False)
    priced = estimate(model, cluster, training, LLAMA_PIPE)
    assert "--no-create-attention-mask-in-dataloader" in launch_config(priced, "megatron").text
    assert "dataset.create_attention_mask=false" in launch_config(priced, "bridge").text
    with_mask = estimate(model, cluster, dataclasses.replace(training, dataloader_attention_mask=True), LLAMA_PIPE)
    assert "create-attention-mask" not in launch_config(with_mask, "megatron").text


def test_the_bridge_reader_takes_the_cuda_graphs_as_megatron_core_reads_them():
    """cuda_graph_scope, when set, replaces cuda_graph_modules (TransformerConfig.__post_init__); a module may be the
    serialised CudaGraphModule enum; Mamba modules have no layer here; the whole iteration takes a dropless MoE."""
    def read(model_fields: dict) -> dict:
        return read_bridge_config({"model": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                                             "num_layers": 48, **model_fields},
                                   "train": {"micro_batch_size": 1, "global_batch_size": 64}})

    scoped = read({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": "full",
                   "cuda_graph_scope": ["attn", "moe_router", "moe_preprocess"]})
    assert scoped.training["launch"] == "cuda_graph" and scoped.training["cuda_graph_impl"] == "transformer_engine"
    assert scoped.training["cuda_graph_modules"] == ("attn", "moe_router", "moe_preprocess")
    enum = read({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": [
        {"_target_": "megatron.core.transformer.enums.CudaGraphModule", "_name_": "attn", "_args_": [1],
         "_call_": True},
        {"_target_": "megatron.core.transformer.enums.CudaGraphModule", "_name_": "mamba", "_args_": [6],
         "_call_": True}]})
    assert enum.training["cuda_graph_modules"] == ("attn",)
    assert any("mamba" in note for note in enum.notes)
    whole = read({"cuda_graph_impl": "full_iteration", "cuda_graph_scope": [], "num_moe_experts": 128,
                  "moe_router_topk": 8})
    assert whole.training["cuda_graph_full_iteration"] and whole.training["launch"] == "cuda_graph"
    assert "launch" not in read({}).training
    # impl none: eager whatever the modules say (Bridge clears them), and no note about them
    for modules in ("full", ["full_iteration"]):
        eager = read({"cuda_graph_impl": "none", "cuda_graph_modules": modules})
        assert "launch" not in eager.training and not any("cuda" in note for note in eager.notes)
    # Mamba's modules alone: nothing of the priced layers captured
    mamba = read({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ["mamba"]})
    assert "launch" not in mamba.training and any("priced eager" in note for note in mamba.notes)
    with pytest.raises(InputError, match="local capture for the whole iteration only"):
        read({"cuda_graph_impl": "local", "cuda_graph_scope": ["attn"]})
    assert read({"cuda_graph_impl": "local", "cuda_graph_scope": ["full_iteration"]}).training[
        "cuda_graph_full_iteration"]
    local = parse_megatron_args("--cuda-graph-impl local --cuda-graph-modules attn").training
    assert (local["launch"], local["cuda_graph_impl"], local["cuda_graph_modules"]) == \
        ("cuda_graph", "local", ("attn",))


def test_a_whole_iteration_graph_takes_a_sync_free_dropless_moe():
    """Megatron-Core asks drop-and-pad routing of per-layer capture of the whole MoE layer only
    (TransformerConfig.__post_init__ checks the local and transformer_engine impls); a whole-iteration capture
    captures no host synchronisation, so a dropless MoE needs HybridEP's static rank budget (Megatron-Bridge's
    whole-iteration MoE recipes), and the all-to-all dispatcher's wait on the token counts is refused."""
    from costmodels.scoring import estimate

    model = autopar.load_model("qwen3-30b-a3b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=64)
    whole = TrainingSpec(seq_len=4096, global_batch_size=64, launch="cuda_graph", cuda_graph_full_iteration=True,
                         moe_dispatcher="deepep", moe_hybridep=True, moe_rank_capacity_factor=1.5)
    assert estimate(model, cluster, whole, QWEN_MOE).step_time_s > 0
    with pytest.raises(InputError, match="drop-and-pad"):
        estimate(model, cluster, dataclasses.replace(whole, cuda_graph_full_iteration=False), QWEN_MOE)
    with pytest.raises(InputError, match="whole-iteration CUDA graph of a MoE"):
        estimate(model, cluster, TrainingSpec(seq_len=4096, global_batch_size=64, launch="cuda_graph",
                                              cuda_graph_full_iteration=True), QWEN_MOE)


def test_bridge_runs_local_capture_for_the_whole_iteration_only():
    """Megatron-Bridge refuses local per-layer capture (utils/cuda_graph.py): the export writes and prices
    transformer_engine, the attention masks with it."""
    from autopar.export.capabilities import runnable_estimate
    from costmodels.scoring import estimate

    model = autopar.load_model("llama-3-8b")
    cluster = autopar.make_cluster(gpu="h100", num_gpus=4)
    local = estimate(model, cluster, TrainingSpec(seq_len=4096, global_batch_size=16, launch="cuda_graph",
                                                  cuda_graph_impl="local"), LLAMA_PIPE)
    adjusted, note = runnable_estimate(local, "bridge")
    assert adjusted.training.cuda_graph_impl == "transformer_engine" and "transformer_engine" in note
    assert adjusted.peak_memory_bytes > local.peak_memory_bytes
    assert runnable_estimate(local, "megatron") == (local, None)


# ---- the output layer's deferred weight gradient, pipeline outputs, TP userbuffers ------------------------------

def test_deferred_output_wgrad_on_the_last_rank():
    """llama-3-8b, pp 2 on 2 GPUs (dp 1), mbs 1, seq 4096, gbs 8: 8 micro-batches. Each deferred one keeps the
    output layer's logit gradient, 2 · 4096 tokens · 128256 vocab, and its input, 2 · 4096 · 4096 (tp 1)."""
    plan = Plan(tp=1, pp=2, mbs=1, zero=1)
    entry = 2 * 4096 * 128256 + 2 * 4096 * 4096
    every = TrainingSpec(seq_len=4096, global_batch_size=8, defer_output_wgrad=True)
    assert terms("llama-3-8b", 2, every, plan, stage=1)["deferred_output_wgrad"] == pytest.approx(8 * entry)
    assert terms("llama-3-8b", 2, every, plan, stage=0)["deferred_output_wgrad"] == 0.0
    limited = TrainingSpec(seq_len=4096, global_batch_size=8, defer_output_wgrad=True, wgrad_deferral_limit=3)
    assert terms("llama-3-8b", 2, limited, plan, stage=1)["deferred_output_wgrad"] == pytest.approx(3 * entry)
    assert params.padded_vocab_size(autopar.load_model("llama-3-8b"), 1) == 128256


def test_pipeline_outputs_kept_without_deallocation():
    """deallocate_pipeline_outputs off: pp 2, 1F1B, rank 0 holds pp - 0 = 2 micro-batches, each keeping its sent
    output, 2 bytes · 4096 tokens · 4096; the last rank sends nothing."""
    plan = Plan(tp=1, pp=2, mbs=1, zero=1)
    kept = TrainingSpec(seq_len=4096, global_batch_size=8, deallocate_pipeline_outputs=False)
    assert terms("llama-3-8b", 2, kept, plan, stage=0)["pipeline_outputs"] == pytest.approx(2 * 2 * 4096 * 4096)
    assert terms("llama-3-8b", 2, kept, plan, stage=1)["pipeline_outputs"] == 0.0
    assert "pipeline_outputs" not in terms("llama-3-8b", 2, TrainingSpec(seq_len=4096, global_batch_size=8), plan)
    # interleaved, pp 4 vpp 2 (8 micro-batches): the last rank warms up (vpp − 1)·pp = 4 chunk-0 passes and holds 5
    # entries at its peak; the 4 of chunk 0 keep their sent output, the chunk-1 one (the loss) none
    interleaved = Plan(tp=1, pp=4, vpp=2, mbs=1, zero=1)
    entry = 2 * 4096 * 4096
    assert terms("llama-3-8b", 4, kept, interleaved, stage=3)["pipeline_outputs"] == pytest.approx(4 * entry)
    assert terms("llama-3-8b", 4, kept, interleaved, stage=0)["pipeline_outputs"] == pytest.approx(11 * entry)


def test_tp_comm_overlap_userbuffers():
    """tp 2 with SP, seq 4096, mbs 1, cp 1: 12 buffers of 4096 × 4096 elements, 8 all-gather ones (bf16: 2 bytes,
    fp8: 1) and 4 reduce-scatter ones (bf16)."""
    plan = Plan(tp=2, pp=1, mbs=1, sp=True, zero=1)
    bf16 = TrainingSpec(seq_len=4096, global_batch_size=64, tp_comm_overlap=True)
    assert terms("llama-3-8b", 8, bf16, plan)["tp_comm_userbuffers"] == pytest.approx(4096 * 4096 * (8 * 2 + 4 * 2))
    fp8 = TrainingSpec(seq_len=4096, global_batch_size=64, tp_comm_overlap=True, precision="fp8",
                       fp8_recipe="tensorwise")
    assert terms("llama-3-8b", 8, fp8, plan)["tp_comm_userbuffers"] == pytest.approx(4096 * 4096 * (8 + 4 * 2))
    # cp 2 halves the rows; tp 1 has no TP overlap
    assert terms("llama-3-8b", 8, bf16, Plan(tp=2, cp=2, pp=1, mbs=1, sp=True, zero=1))["tp_comm_userbuffers"] == \
        pytest.approx(4096 * 4096 * 24 / 2)
    assert terms("llama-3-8b", 8, bf16, Plan(tp=1, pp=1, mbs=1, zero=1))["tp_comm_userbuffers"] == 0.0
    assert "tp_comm_userbuffers" in memory.STAGE_INDEPENDENT_TERMS


# ---- the readers ------------------------------------------------------------------------------------------------

BRIDGE_MOE = {"model": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                        "expert_model_parallel_size": 8, "num_layers": 48, "num_moe_experts": 128,
                        "moe_router_topk": 8, "moe_token_dispatcher_type": "flex",
                        "moe_flex_dispatcher_backend": "hybridep", "moe_expert_rank_capacity_factor": 1.5,
                        "moe_paged_stash": True, "moe_paged_stash_buffer_size_factor_cuda": -1.2,
                        "moe_paged_stash_buffer_size_factor_cpu": 1.0},
              "train": {"micro_batch_size": 1, "global_batch_size": 64}}


def test_the_bridge_reader_takes_the_moe_budget_and_stash():
    run = read_bridge_config(BRIDGE_MOE)
    assert run.training["moe_rank_capacity_factor"] == 1.5
    assert run.training["moe_paged_stash_factor"] == 1.2          # a negative factor: its magnitude
    assert any("pinned host buffer" in note for note in run.notes)
    assert not any("paged_stash" in switch for switch in run.not_priced)
    no_budget = {**BRIDGE_MOE, "model": {**BRIDGE_MOE["model"], "moe_expert_rank_capacity_factor": None}}
    with pytest.raises(InputError, match="moe_paged_stash needs"):
        read_bridge_config(no_budget)
    alltoall = {**BRIDGE_MOE, "model": {**BRIDGE_MOE["model"], "moe_token_dispatcher_type": "alltoall"}}
    with pytest.raises(InputError, match="flex dispatcher"):
        read_bridge_config(alltoall)


def test_the_bridge_reader_takes_offloading_deferral_and_pipeline_outputs():
    base = {"model": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "num_layers": 80,
                      "cpu_offloading": True, "cpu_offloading_num_layers": 20, "cpu_offloading_weights": False},
            "train": {"micro_batch_size": 1, "global_batch_size": 64}}
    assert read_bridge_config(base).training["cpu_offload_layers"] == 20
    piped = {"model": {"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 8, "num_layers": 96,
                       "virtual_pipeline_model_parallel_size": 12, "sequence_parallel": True,
                       "deallocate_pipeline_outputs": False},
             "comm_overlap": {"defer_embedding_wgrad_compute": True, "wgrad_deferral_limit": 22},
             "train": {"micro_batch_size": 1, "global_batch_size": 32}}
    training = read_bridge_config(piped).training
    assert training["defer_output_wgrad"] and training["wgrad_deferral_limit"] == 22
    assert training["deallocate_pipeline_outputs"] is False
    peft = {**base, "peft": {"_target_": "megatron.bridge.peft.lora.LoRA", "dim": 16}}
    with pytest.raises(InputError, match="peft: megatron.bridge.peft.lora.LoRA"):
        read_bridge_config(peft)


def test_megatron_args_take_the_same_switches():
    run = parse_megatron_args("--bf16 --micro-batch-size 1 --global-batch-size 64 --num-experts 128 "
                              "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep "
                              "--moe-expert-rank-capacity-factor 1.5 --moe-paged-stash "
                              "--moe-paged-stash-buffer-size-factor-cuda 1.2")
    assert run.training["moe_rank_capacity_factor"] == 1.5 and run.training["moe_paged_stash_factor"] == 1.2
    default = parse_megatron_args("--bf16 --micro-batch-size 1 --num-experts 8 --moe-token-dispatcher-type flex "
                                  "--moe-flex-dispatcher-backend hybridep --moe-expert-rank-capacity-factor 1.2 "
                                  "--moe-paged-stash")
    assert default.training["moe_paged_stash_factor"] == pytest.approx(1.10)     # TransformerConfig's default
    with pytest.raises(InputError, match="hybridep or ncclep"):
        parse_megatron_args("--bf16 --num-experts 8 --moe-token-dispatcher-type alltoall "
                            "--moe-expert-rank-capacity-factor 1.5")
    with pytest.raises(InputError, match="--moe-paged-stash without"):
        parse_megatron_args("--bf16 --num-experts 8 --moe-paged-stash")
    offload = parse_megatron_args("--bf16 --micro-batch-size 1 --cpu-offloading-num-layers 20")
    assert offload.training["cpu_offload_layers"] == 20
    deferred = parse_megatron_args("--bf16 --pipeline-model-parallel-size 8 --defer-embedding-wgrad-compute "
                                   "--wgrad-deferral-limit 22 --micro-batch-size 1")
    assert deferred.training["defer_output_wgrad"] and deferred.training["wgrad_deferral_limit"] == 22
    with pytest.raises(InputError, match="pipeline model parallel is not used"):
        parse_megatron_args("--bf16 --defer-embedding-wgrad-compute --micro-batch-size 1")


# ---- Bridge's performance launcher and the Llama 3 presets ---------------------------------------------------------

def test_the_launcher_turns_on_the_precision_aware_optimizer_for_bf16_adam():
    def config(optimizer: str = "adam", on: bool = False):
        return types.SimpleNamespace(optimizer=types.SimpleNamespace(optimizer=optimizer,
                                                                     use_precision_aware_optimizer=on))
    cfg = config()
    assert launcher_overrides(cfg, "llama3_8b_pretrain_8gpu_h100_bf16_config")
    assert cfg.optimizer.use_precision_aware_optimizer is True
    for name, cfg in (("llama3_8b_pretrain_8gpu_h100_fp8cs_config", config()),
                      ("qwen3_30b_a3b_pretrain_16gpu_gb200_fp8mx_paged_stash_dev_config", config()),
                      ("llama3_8b_pretrain_8gpu_h100_bf16_config", config("sgd")),
                      ("llama3_8b_pretrain_8gpu_h100_bf16_config", config(on=True))):
        assert launcher_overrides(cfg, name) == []


def test_llama_3_presets():
    """Meta-Llama-3-8B: 2 · 128256 · 4096 embedding and output, 32 layers of attention 2 · 4096² + 2 · 4096 · 1024,
    SwiGLU 3 · 4096 · 14336 and two norms, the final norm: 8,030,261,248 (Meta's 8.03B). Meta-Llama-3-70B:
    2 · 128256 · 8192 + 80 · (2 · 8192² + 2 · 8192 · 1024 + 3 · 8192 · 28672 + 2 · 8192) + 8192 = 70,553,706,496."""
    eight = autopar.load_model("llama-3-8b")
    assert params.total_params(eight) == 2 * 128256 * 4096 + 32 * (2 * 4096 ** 2 + 2 * 4096 * 1024
                                                                    + 3 * 4096 * 14336 + 2 * 4096) + 4096
    assert params.total_params(eight) == 8_030_261_248
    seventy = autopar.load_model("llama-3-70b")
    assert params.total_params(seventy) == 70_553_706_496
    assert eight.max_position_embeddings == seventy.max_position_embeddings == 8192     # Llama 3's 8K context
    # the same layer shapes as Llama 3.1 (Meta's model cards)
    for old, new in ((eight, autopar.load_model("llama-3.1-8b")), (seventy, autopar.load_model("llama-3.1-70b"))):
        assert (old.hidden_size, old.num_layers, old.num_attention_heads, old.num_kv_heads, old.ffn_hidden_size,
                old.vocab_size) == (new.hidden_size, new.num_layers, new.num_attention_heads, new.num_kv_heads,
                                    new.ffn_hidden_size, new.vocab_size)
    assert autopar.models.preset_for_hub_id("meta-llama/Meta-Llama-3-70B") == "llama-3-70b"


def test_hybridep_buffers():
    """qwen3-30b-a3b, tp 1, ep 16 on 16 H100 (NVLink domains of 8), seq 4096, mbs 1: the buffer holds the group's
    worst case, 16 ranks × 4096 tokens = 65536 rows, each the bf16 token (2 · 2048), its fp32 probabilities over
    the domain's experts (8 experts a rank × 8 ranks, 4 bytes each) and 2048/128 fp32 scaling factors:
    65536 · (4096 + 256 + 64) bytes."""
    plan = Plan(tp=1, pp=1, ep=16, etp=1, mbs=1, zero=1)
    training = TrainingSpec(seq_len=4096, global_batch_size=64, moe_dispatcher="deepep", moe_hybridep=True)
    assert terms("qwen3-30b-a3b", 16, training, plan)["moe_dispatcher_buffers"] == pytest.approx(65536 * 4416)
    # on GB200 NVL72 the 16 ranks share one NVLink domain: the probabilities cover 16 ranks' experts
    assert terms("qwen3-30b-a3b", 16, training, plan, gpu="gb200")["moe_dispatcher_buffers"] == \
        pytest.approx(65536 * (4096 + 4 * 8 * 16 + 64))
    assert "moe_dispatcher_buffers" not in terms("qwen3-30b-a3b", 16, TrainingSpec(seq_len=4096), plan)
    run = read_bridge_config(BRIDGE_MOE)
    assert run.training["moe_hybridep"] is True and run.training["moe_dispatcher"] == "deepep"
    with pytest.raises(InputError, match="flex dispatcher"):
        TrainingSpec(moe_hybridep=True)


def test_recipes_fit_prices_twice_the_micro_batch_only_where_megatron_could_run_it():
    from benchmarks.recipes_fit import double_mbs_peak_gib

    model = autopar.load_model("llama-3-8b")
    cluster = autopar.make_cluster(gpu="b200", num_gpus=8)
    plan = Plan(tp=1, pp=1, mbs=2, zero=1)
    # gbs 64 over dp 8: mbs 4 gives 2 micro-batches, a valid step, and more activations
    training = TrainingSpec(seq_len=8192, global_batch_size=64)
    doubled = double_mbs_peak_gib(model, cluster, training, plan)
    single = autopar.estimate(model, cluster, training, plan).peak_memory_bytes / 2**30
    assert doubled > single
    # gbs 16 over dp 8 is 2 sequences a rank: mbs 4 does not split it
    assert double_mbs_peak_gib(model, cluster, TrainingSpec(seq_len=8192, global_batch_size=16), plan) == 0.0
