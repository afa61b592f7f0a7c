"""Memory model: hand-derived toy cases (arithmetic in comments) and hypothesis properties."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from costmodels import memory
from costmodels.errors import InputError
from costmodels.hardware import load_profile
from costmodels.plan import PLAN_FIELDS, Plan, PlanArrays, Recompute
from costmodels.specs import (ClusterSpec, CrossEntropyKernel, Engine, MLASpec, MlpKind, ModelSpec, MoESpec, NormKind,
                              PositionEmbedding, TrainingSpec)

PROFILE = load_profile("a100-80gb")
GIB = 1024**3


def cluster(num_gpus: int) -> ClusterSpec:
    return ClusterSpec(profile=PROFILE, num_gpus=num_gpus, gpus_per_node=num_gpus)


def one(plan: Plan) -> PlanArrays:
    return PlanArrays.from_plans([plan])


def terms_at(model, num_gpus, training, plan, stage=0) -> dict[str, float]:
    terms = memory.memory_terms_bytes(model, cluster(num_gpus), training, one(plan), stage)
    return {name: float(value[0]) for name, value in terms.items()}


# A toy GPT: h=64, a=4 (d=16), 2 layers, 4h MLP (F=256), vocab 128 (already a multiple of 128), learned positions
# for 16 tokens, LayerNorm, biases, tied embedding -> dropout on (GPT-style).
TOY_GPT = ModelSpec(name="toy-gpt", hidden_size=64, num_layers=2, num_attention_heads=4, ffn_hidden_size=256,
                    vocab_size=128, mlp=MlpKind.PLAIN, norm=NormKind.LAYERNORM,
                    position_embedding=PositionEmbedding.LEARNED, max_position_embeddings=16,
                    tied_embeddings=True, linear_bias=True)
PAPER_TRAINING = TrainingSpec(seq_len=16, global_batch_size=1, flash_attention=False,
                              cross_entropy=CrossEntropyKernel.UNFUSED)


def test_toy_gpt_layer_activations_match_korthikanti():
    # s=16, b=1, h=64, a=4. Korthikanti: per layer s·b·h·34 + 5·a·s²·b = 16·64·34 + 5·4·256 = 34816 + 5120 = 39936.
    # Plus the LayerNorm fp32 statistics (mean, rstd: 8 bytes per token per norm): 2·8·16 = 256 -> 40192 per layer.
    # Two layers, one micro-batch in flight (pp=1): 80384.
    terms = terms_at(TOY_GPT, 1, PAPER_TRAINING, Plan())
    assert terms["layer_activations"] == pytest.approx(80384)


def test_toy_gpt_without_dropout_keeps_no_masks():
    # MPT-style: learned positions but dropout 0 (llm-foundry's MPTConfig defaults): the attention-output and
    # MLP-output masks (1 byte × h each per token, outside TP) and the unfused scores' mask and dropout copy
    # (3·a·s²·b = 3·4·256 = 3072) are not stored: per layer 40192 - 2·16·64 - 3072 = 35072, 70144 for two.
    no_dropout = dataclasses.replace(TOY_GPT, dropout=0.0)
    assert terms_at(no_dropout, 1, PAPER_TRAINING, Plan())["layer_activations"] == pytest.approx(70144)
    assert TOY_GPT.dropout == pytest.approx(0.1)             # learned positions, dropout unstated: GPT's 0.1


def test_toy_gpt_tp_without_and_with_sp():
    # t=2 without SP: sbh(10 + 24/t) + 5as²b/t = 1024·(10 + 12) + 5120/2 = 22528 + 2560 = 25088, stats 256
    # (replicated) -> 25344 per layer, 50688 for two.
    terms = terms_at(TOY_GPT, 2, PAPER_TRAINING, Plan(tp=2))
    assert terms["layer_activations"] == pytest.approx(50688)
    # with SP everything is split: (34816 + 5120 + 256)/2 = 20096 per layer, 40192 for two.
    terms = terms_at(TOY_GPT, 2, PAPER_TRAINING, Plan(tp=2, sp=True))
    assert terms["layer_activations"] == pytest.approx(40192)


def test_toy_gpt_selective_and_full_recompute():
    # selective drops 5as²b: 34816 + 256 = 35072 per layer -> 70144.
    terms = terms_at(TOY_GPT, 1, PAPER_TRAINING, Plan(recompute=Recompute.SELECTIVE))
    assert terms["layer_activations"] == pytest.approx(70144)
    # full keeps 2sbh = 2·16·64 = 2048 per layer -> 4096, plus the working set of one recomputed layer (40192).
    terms = terms_at(TOY_GPT, 1, PAPER_TRAINING, Plan(recompute=Recompute.FULL))
    assert terms["layer_activations"] == 0
    assert terms["recomputed_layer_inputs"] == pytest.approx(4096)
    assert terms["recompute_working_set"] == pytest.approx(40192)
    # partial: recompute_layers=1 -> one layer stored whole (40192), one recomputed (2048)
    terms = terms_at(TOY_GPT, 1, PAPER_TRAINING, Plan(recompute=Recompute.FULL, recompute_layers=1))
    assert terms["layer_activations"] == pytest.approx(40192)
    assert terms["recomputed_layer_inputs"] == pytest.approx(2048)


def test_toy_gpt_weights_and_optimizer():
    # One layer: QKV 3·64² + O 64² = 16384, their biases 3·64 + 64 = 256 -> 16640; two LayerNorms 2·128 = 256;
    # MLP 2·64·256 = 32768 + biases 256 + 64 = 33088. Layer = 49984, two layers = 99968 params.
    terms = terms_at(TOY_GPT, 1, PAPER_TRAINING, Plan())
    assert terms["weights"] == pytest.approx(2 * 99968)
    assert terms["gradients"] == pytest.approx(4 * 99968)
    assert terms["optimizer_states"] == pytest.approx(12 * 99968)
    # Embedding 128·64 = 8192 + positions 16·64 = 1024 + final LayerNorm 128 = 9344 (tied: no separate output layer).
    assert terms["embedding_weights"] == pytest.approx(2 * 9344)
    # zero=1 on 4 GPUs (dp=4): optimizer 12/4 = 3 bytes per param, weights and gradients unchanged.
    terms = terms_at(TOY_GPT, 4, PAPER_TRAINING, Plan(zero=1))
    assert terms["optimizer_states"] == pytest.approx(3 * 99968)
    assert terms["gradients"] == pytest.approx(4 * 99968)
    # zero=3: 18/4 bytes per param over weights + gradients + optimizer
    terms = terms_at(TOY_GPT, 4, PAPER_TRAINING, Plan(zero=3))
    assert terms["weights"] + terms["gradients"] + terms["optimizer_states"] == pytest.approx(18 / 4 * 99968)


def test_bf16_gradient_reduce_halves_every_gradient_term():
    # grad_reduce_in_fp32 off (--grad-reduce-in-bf16): Megatron-Core's grad buffer has the parameters' dtype, 2 bytes
    # per param instead of 4 -- decoder, embedding and expert gradients, and ZeRO-2's unsharded gradient bucket.
    bf16_grads = dataclasses.replace(PAPER_TRAINING, grad_reduce_in_fp32=False)
    assert bf16_grads.gradient_bytes_per_param == 2 and PAPER_TRAINING.gradient_bytes_per_param == 4
    fp32 = terms_at(TOY_GPT, 1, PAPER_TRAINING, Plan())
    bf16 = terms_at(TOY_GPT, 1, bf16_grads, Plan())
    assert bf16["gradients"] == pytest.approx(2 * 99968)
    assert bf16["embedding_gradients"] == pytest.approx(fp32["embedding_gradients"] / 2)
    assert {k: v for k, v in bf16.items() if "gradient" not in k} == {k: v for k, v in fp32.items()
                                                                     if "gradient" not in k}
    # zero=2 on 4 GPUs: the shard 2/4 bytes per param; the bucket (the other 3/4 of one layer, 49984 params) 2 bytes
    zero2 = terms_at(TOY_GPT, 4, bf16_grads, Plan(zero=2))
    assert zero2["gradients"] == pytest.approx(2 / 4 * 99968)
    assert zero2["zero_gradient_buckets"] == pytest.approx(
        terms_at(TOY_GPT, 4, PAPER_TRAINING, Plan(zero=2))["zero_gradient_buckets"] / 2)
    moe_training = TrainingSpec(seq_len=16, global_batch_size=8, grad_reduce_in_fp32=False)
    assert terms_at(TOY_MOE, 8, moe_training, Plan(ep=4, etp=1, zero=1))["expert_gradients"] == pytest.approx(
        2 * 24576)


def test_the_optimizer_steps_fp32_copy_of_bf16_gradients_is_its_share_of_the_parameters():
    # 99968 layer + 9344 embedding params; 4 bytes each at zero 0 (every parameter copied), a quarter on 4 GPUs
    # under the distributed optimizer, none with fp32 gradients (main_grad.float() returns main_grad itself)
    bf16_grads = dataclasses.replace(PAPER_TRAINING, grad_reduce_in_fp32=False)
    def copy(training, num_gpus, plan):
        return float(memory.optimizer_step_grad_copy_bytes(TOY_GPT, cluster(num_gpus), training, one(plan), 0)[0])
    assert copy(bf16_grads, 1, Plan()) == pytest.approx(4 * (99968 + 9344))
    assert copy(bf16_grads, 4, Plan(zero=1)) == pytest.approx(4 * (99968 + 9344) / 4)
    assert copy(PAPER_TRAINING, 1, Plan()) == 0.0
    moe_training = TrainingSpec(seq_len=16, global_batch_size=8, grad_reduce_in_fp32=False)
    expert = float(memory.optimizer_step_grad_copy_bytes(TOY_MOE, cluster(8), moe_training,
                                                         one(Plan(ep=4, etp=1, zero=1)), 0)[0])
    dense = terms_at(TOY_MOE, 8, moe_training, Plan(ep=4, etp=1, zero=1))
    # experts over edp = 2, the rest over dp = 8
    assert expert == pytest.approx(4 * 24576 / 2 + 2 * (dense["weights"] + dense["embedding_weights"]) / 8)


def test_toy_gpt_loss_side():
    # last stage (pp=1): unfused logits fp32 s·V/t = 16·128·4 = 8192; CE buffers: bf16 logits 16·128·2 = 4096 +
    # 3 fp32 per token 16·12 = 192 -> 4288; output side: final norm input 2h + stats 8 = 136 and output-layer input
    # 2h = 128 per token -> 264·16 = 4224. Embedding: token ids 8·16 = 128 + dropout mask 64·16 = 1024 -> 1152.
    terms = terms_at(TOY_GPT, 1, PAPER_TRAINING, Plan())
    assert terms["logits"] == pytest.approx(8192)
    assert terms["cross_entropy_buffers"] == pytest.approx(4288)
    assert terms["output_layer_activations"] == pytest.approx(4224)
    assert terms["embedding_activations"] == pytest.approx(1152)
    fused = dataclasses.replace(PAPER_TRAINING, cross_entropy=CrossEntropyKernel.FUSED)
    assert terms_at(TOY_GPT, 1, fused, Plan())["logits"] == pytest.approx(4096)    # bf16
    # apex's xentropy saves the bf16 logits themselves and 3 fp32 values per token: 4096 and 192
    xentropy = terms_at(TOY_GPT, 1, dataclasses.replace(PAPER_TRAINING, cross_entropy="xentropy"), Plan())
    assert xentropy["logits"] == pytest.approx(4096) and xentropy["cross_entropy_buffers"] == pytest.approx(192)


# A toy Llama: h=64, a=4, g=1 (MQA), d=16, SwiGLU F=128, RMSNorm, RoPE (no dropout), flash attention.
TOY_LLAMA = ModelSpec(name="toy-llama", hidden_size=64, num_layers=4, num_attention_heads=4, num_kv_heads=1,
                      ffn_hidden_size=128, vocab_size=256)


def test_toy_llama_gqa_swiglu_flash():
    # Per token: two RMSNorms 2·(2·64 + 4) = 264; QKV input 2·64 = 128; Q 2·64 + K 2·16 + V 2·16 + O-input 2·64
    # = 320; log-sum-exp 4 bytes × 4 heads = 16; MLP input 128; SwiGLU [gate, up] 2·2·128 = 512 + down input
    # 2·128 = 256 -> 768. Total 264 + 128 + 320 + 16 + 128 + 768 = 1624 bytes/token; 16 tokens -> 25984 per layer.
    training = TrainingSpec(seq_len=16, global_batch_size=1)
    terms = terms_at(TOY_LLAMA, 1, training, Plan())
    assert terms["layer_activations"] == pytest.approx(4 * 25984)
    # without flash attention Megatron's unfused core repeats K and V to all 4 heads: +2·(64 - 16)·2 = 192 bytes/token,
    # the 16-byte log-sum-exp goes and the softmax output 2·a·s = 2·4·16 = 128 bytes/token comes (no dropout):
    # 1624 + 192 - 16 + 128 = 1928 per token.
    unfused = dataclasses.replace(training, flash_attention=False)
    assert terms_at(TOY_LLAMA, 1, unfused, Plan())["layer_activations"] == pytest.approx(4 * 16 * 1928)


def test_in_flight_microbatches():
    plans = PlanArrays.from_plans([Plan(pp=4), Plan(pp=4), Plan(pp=4, vpp=2), Plan(pp=4, vpp=2), Plan(pp=4)])
    stage = np.array([0, 3, 0, 3, 0])
    # 1F1B: pp - r = 4, 1; interleaved: pp + (pp - 2r - 1)/vpp = 4 + 3/2 = 5.5 (= 4·(1 + 3/8)), 4 - 3/2 = 2.5;
    # the last plan has only 2 micro-batches per step.
    microbatches = np.array([64, 64, 64, 64, 2])
    held = memory.in_flight_microbatches(plans, stage, microbatches)
    np.testing.assert_allclose(held, [4, 1, 5.5, 2.5, 2])


@pytest.mark.parametrize("pp, vpp, group, microbatches", [(4, 2, 0, 16), (8, 4, 0, 32), (4, 3, 8, 12), (2, 2, 0, 4),
                                                          (4, 2, 0, 2), (8, 2, 16, 40)])
def test_the_schedule_walk_holds_what_the_closed_form_says_with_equal_chunks(pp, vpp, group, microbatches):
    """Every rank, equal chunks: the walk over Megatron-Core's schedule table peaks at W + 1 entries (capped at all
    of them), in_flight_microbatches' closed form."""
    plans = PlanArrays.from_plans([Plan(pp=pp, vpp=vpp)] * pp)
    closed = memory.in_flight_microbatches(plans, np.arange(pp), np.full(pp, float(microbatches)), group=group)
    for rank in range(pp):
        walked = memory.interleaved_held_layers(pp, vpp, rank, microbatches, group, [3.0] * vpp)
        assert walked / (3.0 * vpp) == pytest.approx(closed[rank])


def test_a_heavy_first_chunk_is_held_longest():
    """Rank 0 of pp 4, vpp 2, 16 micro-batches: chunk 0 stays held through the warmup's 6 + 4 forwards, chunk 1 is
    released first, so 7 + 1 layers hold 59 layer-micro-batches at the peak, 1 + 7 hold 35 and 4 + 4 hold 44
    (the closed form's 5.5 whole-rank micro-batches of 8 layers, for any split)."""
    assert memory.interleaved_held_layers(4, 2, 0, 16, 0, [7.0, 1.0]) == 59.0
    assert memory.interleaved_held_layers(4, 2, 0, 16, 0, [1.0, 7.0]) == 35.0
    assert memory.interleaved_held_layers(4, 2, 0, 16, 0, [4.0, 4.0]) == 44.0
    # an explicit layout prices it: rank 0 of the heavy-first layout holds more activations than of the even one
    model = dataclasses.replace(TOY_GPT, num_layers=32)
    cluster = ClusterSpec(profile=PROFILE, num_gpus=4)
    training = TrainingSpec(seq_len=16, global_batch_size=16)
    even = memory.layout_memory_terms_bytes(model, cluster, training, Plan(pp=4, vpp=2, layout=(4,) * 8))
    heavy = memory.layout_memory_terms_bytes(model, cluster, training,
                                             Plan(pp=4, vpp=2, layout=(7, 4, 4, 4, 1, 4, 4, 4)))
    ratio = heavy["layer_activations"][0] / even["layer_activations"][0]
    assert ratio == pytest.approx(59 / 44)


# Toy MoE: h=64, a=4, 4 layers, 4 experts of width 32, top-2, no shared experts.
TOY_MOE = ModelSpec(name="toy-moe", hidden_size=64, num_layers=4, num_attention_heads=4, ffn_hidden_size=128,
                    vocab_size=256, moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=32))


def test_toy_moe_activations():
    # T = 16 tokens, tp=etp=1, load 1. Router: (2+4)·E + (4+8)·k = 24 + 24 = 48 bytes/token -> 768 per layer.
    # Dispatch: the routing weight of each received copy, fp32: 16·2 = 32 copies × 4 = 128 per layer (no hidden-state
    # copy: Megatron-Core >= 0.12 applies the weights in the experts' activation).
    # Experts: 32 received tokens × (2h + 6·32) = 32·(128 + 192) = 10240 per layer. 4 layers each.
    training = TrainingSpec(seq_len=16, global_batch_size=1)
    terms = terms_at(TOY_MOE, 1, training, Plan())
    assert terms["moe_router_activations"] == pytest.approx(4 * 768)
    assert terms["moe_dispatch_activations"] == pytest.approx(4 * 128)
    assert terms["expert_mlp_activations"] == pytest.approx(4 * 10240)
    # dropless with imbalance 1.5 scales the expert part; a capacity factor 1.25 caps it at 1.25
    skewed = dataclasses.replace(training, moe_imbalance_factor=1.5)
    assert terms_at(TOY_MOE, 1, skewed, Plan())["expert_mlp_activations"] == pytest.approx(1.5 * 4 * 10240)
    capped = dataclasses.replace(skewed, moe_capacity_factor=1.25)
    assert terms_at(TOY_MOE, 1, capped, Plan())["expert_mlp_activations"] == pytest.approx(1.25 * 4 * 10240)


def test_toy_moe_recompute_working_set_holds_the_dispatch_buffers():
    # Full recompute re-runs one MoE layer: everything it stores, plus the all-to-all's send and receive buffers that
    # are not stored but live while its forward runs: 2 × 2 bytes × k·h = 2·2·2·64 = 512 bytes/token -> 8192.
    training = TrainingSpec(seq_len=16, global_batch_size=1)
    kept = terms_at(TOY_MOE, 1, training, Plan())
    stored_per_layer = sum(kept[name] for name in ("layer_activations", "moe_router_activations",
                                                   "moe_dispatch_activations", "expert_mlp_activations")) / 4
    full = terms_at(TOY_MOE, 1, training, Plan(recompute=Recompute.FULL))
    assert full["recompute_working_set"] == pytest.approx(stored_per_layer + 8192)


def test_expert_states_shard_over_expert_data_parallel():
    # 8 GPUs, ep=4, etp=1, tp=1, pp=1: edp = 8/4 = 2, dp = 8. Expert params per GPU: 4 layers × 4 experts ×
    # 3·64·32 = 24576 / 4 = 24576. zero=1: optimizer 12/2 = 6 bytes per expert param.
    training = TrainingSpec(seq_len=16, global_batch_size=8)
    terms = terms_at(TOY_MOE, 8, training, Plan(ep=4, etp=1, zero=1))
    assert terms["expert_weights"] == pytest.approx(2 * 24576)
    assert terms["expert_optimizer_states"] == pytest.approx(6 * 24576)


def test_korthikanti_22b_layer_activations():
    # 22B, tp=8, no SP, b=4, s=2048: 48 layers × sbh(10 + 24/8 + 5as/(8h)) = 59.25 GiB (paper Figure 1).
    model = ModelSpec(name="22B", hidden_size=6144, num_layers=48, num_attention_heads=64, ffn_hidden_size=24576,
                      vocab_size=51200, mlp=MlpKind.PLAIN, norm=NormKind.LAYERNORM,
                      position_embedding=PositionEmbedding.LEARNED, max_position_embeddings=2048,
                      tied_embeddings=True, linear_bias=True)
    training = TrainingSpec(seq_len=2048, global_batch_size=4, flash_attention=False,
                            cross_entropy=CrossEntropyKernel.UNFUSED)
    terms = terms_at(model, 8, training, Plan(tp=8, mbs=4))
    assert terms["layer_activations"] / GIB == pytest.approx(59.25, rel=2e-3)


def test_fixed_overheads_are_named_terms():
    terms = terms_at(TOY_GPT, 1, PAPER_TRAINING, Plan())
    for name, value in PROFILE.memory_overheads_bytes.items():
        assert terms[name] == value
        assert memory.term_knobs(name) == ()


def test_every_term_declares_its_knobs():
    moe_mtp = dataclasses.replace(TOY_MOE, num_mtp_layers=1)
    terms = terms_at(moe_mtp, 1, TrainingSpec(seq_len=16, global_batch_size=1), Plan())
    for name in terms:
        if name not in PROFILE.memory_overheads_bytes:
            assert name in memory.TERM_KNOBS, name
            assert set(memory.TERM_KNOBS[name]) <= set(PLAN_FIELDS)


# ---- hypothesis: models and plans ----------------------------------------------------------------------------------

@st.composite
def models(draw, moe: bool | None = None) -> ModelSpec:
    heads = draw(st.sampled_from([4, 8]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8) if heads % h == 0]))
    hidden = draw(st.sampled_from([64, 128]))
    layers = draw(st.sampled_from([8, 16, 24]))
    gpt_style = draw(st.booleans())
    with_moe = draw(st.booleans()) if moe is None else moe
    moe_spec = None
    if with_moe:
        shared = draw(st.integers(0, 1))
        moe_spec = MoESpec(num_experts=draw(st.sampled_from([4, 8])), top_k=draw(st.integers(1, 2)),
                           expert_ffn_hidden_size=draw(st.sampled_from([32, 96])), num_shared_experts=shared,
                           shared_expert_ffn_hidden_size=64 * shared, first_dense_layers=draw(st.integers(0, 3)),
                           layer_freq=draw(st.integers(1, 2)))
    mla = None
    if not gpt_style and draw(st.booleans()):
        mla = MLASpec(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                      q_lora_rank=draw(st.sampled_from([0, 48])))
    return ModelSpec(
        name="hyp", hidden_size=hidden, num_layers=layers, num_attention_heads=heads,
        num_kv_heads=heads if mla is not None else kv, ffn_hidden_size=draw(st.sampled_from([128, 352])),
        vocab_size=draw(st.sampled_from([100, 1000, 5000])),
        mlp=MlpKind.PLAIN if gpt_style else MlpKind.GATED, norm=NormKind.LAYERNORM if gpt_style else NormKind.RMSNORM,
        position_embedding=PositionEmbedding.LEARNED if gpt_style else PositionEmbedding.ROPE,
        max_position_embeddings=64 if gpt_style else 0, tied_embeddings=draw(st.booleans()),
        linear_bias=gpt_style, moe=moe_spec, mla=mla, num_mtp_layers=draw(st.integers(0, 1)) if with_moe else 0,
        dropout=draw(st.sampled_from([None, 0.0, 0.1])))


@st.composite
def trainings(draw) -> TrainingSpec:
    capacity = draw(st.sampled_from([None, 1.0, 1.25]))
    return TrainingSpec(seq_len=draw(st.sampled_from([32, 64])), global_batch_size=1,
                        flash_attention=draw(st.booleans()), cross_entropy=draw(st.sampled_from(list(CrossEntropyKernel))),
                        moe_capacity_factor=capacity, moe_imbalance_factor=draw(st.sampled_from([1.0, 1.3])))


@st.composite
def setups(draw, model_strategy=None, uneven: bool = True):
    """(model, num_gpus, training, plan) with a plan whose layer split is whole."""
    model = draw(model_strategy if model_strategy is not None else models())
    training = draw(trainings())
    tp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([p for p in (1, 2, 4, 8) if model.num_layers % p == 0]))
    first = last = 0
    if uneven and pp > 2 and draw(st.booleans()):
        middle = model.num_layers // pp
        first = draw(st.integers(1, middle))
        last = draw(st.integers(1, middle))
        rest = model.num_layers - first - last
        if rest % (pp - 2):
            first = last = 0
    layers_per_middle = (model.num_layers - first - last) // (pp - (first > 0) - (last > 0)) if pp > 1 else \
        model.num_layers
    vpp_choices = [v for v in (1, 2) if pp > 1 or v == 1]
    vpp = draw(st.sampled_from([v for v in vpp_choices if layers_per_middle % v == 0 and first % v == 0
                                and last % v == 0]))
    cp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 4]))
    mbs = draw(st.integers(1, 2))
    num_gpus = tp * cp * pp * dp
    etp = draw(st.sampled_from([1, tp]))
    ep = draw(st.sampled_from([e for e in (1, 2, 4) if (model.moe is None or model.moe.num_experts % e == 0)
                               and num_gpus % (etp * e * pp) == 0]))    # edp = N/(etp·ep·pp) whole
    recompute = draw(st.sampled_from(list(Recompute)))
    plan = Plan(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, mbs=mbs, sp=tp > 1 and draw(st.booleans()),
                recompute=recompute, recompute_layers=draw(st.integers(0, 2)) if recompute is Recompute.FULL else 0,
                zero=draw(st.integers(0, 3)), first_stage_layers=first, last_stage_layers=last)
    microbatches = draw(st.integers(1, 12))
    training = dataclasses.replace(training, global_batch_size=dp * mbs * microbatches)
    return model, num_gpus, training, plan


def peak_of(model, num_gpus, training, plan) -> float:
    return float(memory.peak_memory(model, cluster(num_gpus), training, one(plan))[0][0])


def brute_force(model, num_gpus, training, plan, group=None) -> float:
    """Max over every pipeline rank of the total (or of a group of terms)."""
    best = 0.0
    for stage in range(plan.pp):
        terms = memory.memory_terms_bytes(model, cluster(num_gpus), training, one(plan), stage)
        total = memory.total_bytes(terms) if group is None else memory.group_bytes(terms, group)
        best = max(best, float(total[0]))
    return best


def with_gpus(setup, **changes):
    """The same setup with knobs changed and num_gpus scaled so that dp stays the same."""
    model, num_gpus, training, plan = setup
    new = dataclasses.replace(plan, **changes)
    if "etp" not in changes and plan.etp == plan.tp:
        new = dataclasses.replace(new, etp=new.tp)
    scale = (new.tp * new.cp * new.pp) / (plan.tp * plan.cp * plan.pp)
    return model, int(round(num_gpus * scale)), training, new


# ---- properties ----------------------------------------------------------------------------------------------------

@given(setups())
def test_total_is_sum_of_named_terms_and_peak_is_brute_force_max(setup):
    model, num_gpus, training, plan = setup
    peak, stage, terms = memory.peak_memory(model, cluster(num_gpus), training, one(plan))
    assert peak[0] == pytest.approx(float(memory.total_bytes(terms)[0]), rel=1e-12)
    assert peak[0] == pytest.approx(brute_force(model, num_gpus, training, plan), rel=1e-12)
    stage_terms = memory.memory_terms_bytes(model, cluster(num_gpus), training, one(plan), int(stage[0]))
    assert float(memory.total_bytes(stage_terms)[0]) == pytest.approx(peak[0], rel=1e-12)


@pytest.mark.slow
@given(setups(model_strategy=models(moe=True)))
def test_peak_is_brute_force_max_for_moe_layer_patterns(setup):
    # dense-first layers and layer_freq 2 make middle ranks differ: the candidate ranks must still hold the max
    assert peak_of(*setup) == pytest.approx(brute_force(*setup), rel=1e-12)


@given(st.lists(setups(), min_size=2, max_size=6), st.integers(0, 7))
def test_batch_and_one_at_a_time_agree(setup_list, stage):
    # one model/cluster/training for the batch: take the first setup's, plans from all (rebuilt for its model)
    model, num_gpus, training, _ = setup_list[0]
    plans = [dataclasses.replace(p, first_stage_layers=0, last_stage_layers=0, vpp=1,
                                 pp=p.pp if model.num_layers % p.pp == 0 else 1) for *_, p in setup_list]
    batch = PlanArrays.from_plans(plans)
    peak, worst, terms = memory.peak_memory(model, cluster(num_gpus), training, batch)
    stages = np.minimum(stage, batch.pp - 1)
    at_stage = memory.memory_terms_bytes(model, cluster(num_gpus), training, batch, stages)
    for i, plan in enumerate(plans):
        p1, w1, t1 = memory.peak_memory(model, cluster(num_gpus), training, one(plan))
        assert peak[i] == pytest.approx(p1[0], rel=1e-12)
        assert worst[i] == w1[0]
        for name in terms:
            assert terms[name][i] == pytest.approx(t1[name][0], rel=1e-12, abs=1e-9)
        single = memory.memory_terms_bytes(model, cluster(num_gpus), training, one(plan), int(stages[i]))
        for name in at_stage:
            assert at_stage[name][i] == pytest.approx(single[name][0], rel=1e-12, abs=1e-9)


@given(setups(uneven=False), st.sampled_from(["tp", "pp", "ep"]))
def test_model_states_never_increase_with_tp_pp_ep(setup, knob):
    model, num_gpus, training, plan = setup
    value = getattr(plan, knob)
    bigger = value * 2
    if knob == "pp" and model.num_layers % bigger:
        return
    if knob == "ep" and model.moe is not None and model.moe.num_experts % bigger:
        return
    changes = {knob: bigger}
    if knob == "pp":
        changes["vpp"] = 1
    before = with_gpus(setup, vpp=1) if knob == "pp" else setup
    after = with_gpus(setup, **changes)
    group = memory.MODEL_STATE_TERMS
    assert brute_force(*after, group=group) <= brute_force(*before, group=group) * (1 + 1e-12)


@given(setups(uneven=False), st.sampled_from(["tp", "cp"]))
def test_activations_never_increase_with_tp_under_sp_or_cp(setup, knob):
    model, num_gpus, training, plan = setup
    before = with_gpus(setup, sp=True) if knob == "tp" else setup
    if knob == "tp" and before[3].tp == 1:
        before = with_gpus(setup, tp=2, sp=True)
    bigger = getattr(before[3], knob) * 2
    if knob == "cp" and training.seq_len % (2 * bigger):
        return
    after = with_gpus(before, **{knob: bigger})
    for stage in range(plan.pp):
        a = memory.memory_terms_bytes(after[0], cluster(after[1]), after[2], one(after[3]), stage)
        b = memory.memory_terms_bytes(before[0], cluster(before[1]), before[2], one(before[3]), stage)
        assert memory.group_bytes(a, memory.ACTIVATION_TERMS)[0] <= \
            memory.group_bytes(b, memory.ACTIVATION_TERMS)[0] * (1 + 1e-12)


STORED_ACTIVATIONS = tuple(t for t in memory.ACTIVATION_TERMS if t != "recompute_working_set")


@given(setups())
def test_full_le_selective_le_none(setup):
    model, num_gpus, training, plan = setup

    def stored(recompute: Recompute) -> float:
        variant = dataclasses.replace(plan, recompute=recompute, recompute_layers=0)
        return brute_force(model, num_gpus, training, variant, group=STORED_ACTIVATIONS)

    full, selective, none = stored(Recompute.FULL), stored(Recompute.SELECTIVE), stored(Recompute.NONE)
    assert full <= selective * (1 + 1e-12)
    assert selective <= none * (1 + 1e-12)
    # with the transient working set of the recomputed layer, full recompute still needs no more than keeping
    # everything on every rank that holds at least two layer-micro-batches (the working set is one of them; a rank
    # with one layer and one micro-batch gains nothing from recomputing it)
    full_plan = dataclasses.replace(plan, recompute=Recompute.FULL, recompute_layers=0)
    none_plan = dataclasses.replace(plan, recompute=Recompute.NONE, recompute_layers=0)
    for stage in range(plan.pp):
        shape = memory.stage_shape(model, cluster(num_gpus), training, one(full_plan), stage)
        if shape.layers[0] * shape.in_flight[0] < 2:
            continue
        full_terms = memory.memory_terms_bytes(model, cluster(num_gpus), training, one(full_plan), stage)
        none_terms = memory.memory_terms_bytes(model, cluster(num_gpus), training, one(none_plan), stage)
        assert memory.group_bytes(full_terms, memory.ACTIVATION_TERMS)[0] <= \
            memory.group_bytes(none_terms, memory.ACTIVATION_TERMS)[0] * (1 + 1e-12)


@given(setups(), st.integers(0, 2))
def test_more_zero_never_needs_more_memory(setup, zero):
    model, num_gpus, training, plan = setup
    lower = dataclasses.replace(plan, zero=zero)
    higher = dataclasses.replace(plan, zero=zero + 1)
    assert peak_of(model, num_gpus, training, higher) <= peak_of(model, num_gpus, training, lower) * (1 + 1e-12)


KNOB_VARIANTS = {"tp": [1, 2, 4], "pp": [1, 2, 4], "vpp": [1, 2], "cp": [1, 2], "ep": [1, 2, 4], "etp": [1, 2, 4],
                 "mbs": [1, 2, 3], "sp": [False, True], "recompute": list(Recompute), "recompute_layers": [0, 1, 2],
                 "zero": [0, 1, 2, 3], "first_stage_layers": [0, 1, 2], "last_stage_layers": [0, 1, 2]}


@given(setups(model_strategy=models(moe=True)), st.sampled_from(sorted(KNOB_VARIANTS)), st.data())
def test_terms_depend_only_on_their_declared_knobs(setup, knob, data):
    model, num_gpus, training, plan = setup
    value = data.draw(st.sampled_from(KNOB_VARIANTS[knob]))
    other = dataclasses.replace(plan, **{knob: value})
    stage = data.draw(st.integers(0, plan.pp - 1))
    if knob == "pp":
        stage = 0                       # rank 0 exists for every pp
    a = memory.memory_terms_bytes(model, cluster(num_gpus), training, one(plan), stage)
    b = memory.memory_terms_bytes(model, cluster(num_gpus), training, one(other), stage)
    for name in a:
        if knob not in memory.term_knobs(name, training):
            assert a[name][0] == pytest.approx(b[name][0], rel=1e-12, abs=1e-9), (name, knob)


def test_stage_dependence_is_declared_for_every_term():
    assert set(memory.TERM_STAGE_DEPENDENCE) == set(memory.TERM_KNOBS)


@given(setups(model_strategy=models(moe=True)))
def test_first_and_last_only_terms_vanish_elsewhere(setup):
    model, num_gpus, training, plan = setup
    for stage in range(plan.pp):
        terms = memory.memory_terms_bytes(model, cluster(num_gpus), training, one(plan), stage)
        for name, value in terms.items():
            where = memory.TERM_STAGE_DEPENDENCE.get(name)
            if (where == "first" and stage != 0) or (where == "last" and stage != plan.pp - 1) or \
                    (where == "first_and_last" and 0 < stage < plan.pp - 1):
                assert value[0] == 0, (name, stage)


# ---- gradients freed between steps (PyTorch optimizers' zero_grad(set_to_none=True)) ---------------------------------

FREED_GRADIENT_MODEL = ModelSpec(name="freed-grads", hidden_size=1024, num_layers=8, num_attention_heads=8,
                                 ffn_hidden_size=4096, vocab_size=32000)


def _gradient_and_activation_sums(terms: dict[str, float]) -> tuple[float, float]:
    gradients = sum(value for name, value in terms.items() if name in memory.GRADIENT_TERMS)
    activations = sum(value for name, value in terms.items() if name in memory.ACTIVATION_TERMS)
    return gradients, activations


@pytest.mark.parametrize("engine", [Engine.TORCHTITAN, Engine.PYTORCH])
@pytest.mark.parametrize("seq_len, recompute", [(4096, Recompute.NONE), (64, Recompute.FULL)])
def test_freed_gradients_count_at_the_peak_only_beyond_the_activations_of_a_single_micro_batch(engine, seq_len,
                                                                                             recompute):
    """One micro-batch a step: the gradients appear as the backward frees the activations, so only what they exceed
    the activations by raises the peak; with two micro-batches the first one's gradients are all there. A plain
    PyTorch loop's DDP keeps a second copy in its all-reduce buckets; FSDP, torchtitan and Megatron-Core have none."""
    plan = Plan(tp=1, pp=1, mbs=1, zero=3, recompute=recompute)
    one_step = TrainingSpec(seq_len=seq_len, global_batch_size=8, engine=engine)
    accumulating = dataclasses.replace(one_step, global_batch_size=16)             # 2 micro-batches a step
    single = terms_at(FREED_GRADIENT_MODEL, 8, one_step, plan)
    double = terms_at(FREED_GRADIENT_MODEL, 8, accumulating, plan)
    all_gradients, _ = _gradient_and_activation_sums(double)
    _, activations = _gradient_and_activation_sums(single)
    share = max(0.0, 1.0 - activations / all_gradients)
    for name in memory.GRADIENT_TERMS:
        if name in single:
            assert single[name] == pytest.approx(double[name] * share, rel=1e-9), name
    megatron = dataclasses.replace(one_step, engine=Engine.MEGATRON)
    assert _gradient_and_activation_sums(terms_at(FREED_GRADIENT_MODEL, 8, megatron, plan))[0] == \
        pytest.approx(all_gradients, rel=1e-9)            # Megatron-Core's gradient buffer stays
    ddp = dataclasses.replace(plan, zero=0)           # zero 0: the freed .grad as above
    ddp_single, ddp_double = terms_at(FREED_GRADIENT_MODEL, 8, one_step, ddp), terms_at(FREED_GRADIENT_MODEL, 8,
                                                                                          accumulating, ddp)
    ddp_gradients = _gradient_and_activation_sums(ddp_double)[0]
    assert _gradient_and_activation_sums(ddp_single)[0] == pytest.approx(
        ddp_gradients * max(0.0, 1.0 - _gradient_and_activation_sums(ddp_single)[1] / ddp_gradients), rel=1e-9)
    if engine is Engine.PYTORCH:                      # DDP's buckets: a second copy of every gradient, always there
        assert ddp_single["ddp_gradient_buckets"] == pytest.approx(ddp_gradients, rel=1e-9)
        assert ddp_double["ddp_gradient_buckets"] == pytest.approx(ddp_gradients, rel=1e-9)
        assert terms_at(FREED_GRADIENT_MODEL, 8, one_step, plan)["ddp_gradient_buckets"] == 0.0    # FSDP: none
        no_dp = dataclasses.replace(ddp, tp=8)        # tp 8 on 8 GPUs: no data parallelism, no DDP
        assert terms_at(FREED_GRADIENT_MODEL, 8, one_step, no_dp)["ddp_gradient_buckets"] == 0.0
    else:                                             # torchtitan replicates with fully_shard, not DDP
        assert "ddp_gradient_buckets" not in ddp_single
    assert "ddp_gradient_buckets" not in terms_at(FREED_GRADIENT_MODEL, 8, megatron, ddp)
    if seq_len == 4096:
        assert share == 0.0                               # activations of 4K tokens outweigh the gradient shards
    else:
        assert 0.0 < share < 1.0                          # 64 tokens with full recompute: the gradients set the peak


@given(setups(model_strategy=models(moe=True)), st.sampled_from(sorted(KNOB_VARIANTS)), st.data())
def test_freed_gradient_terms_depend_only_on_their_declared_knobs(setup, knob, data):
    model, num_gpus, training, plan = setup
    dp = num_gpus // (plan.tp * plan.cp * plan.pp)
    try:                                    # one micro-batch a step, where the share reads the activations
        training = dataclasses.replace(training, engine=Engine.TORCHTITAN, global_batch_size=dp * plan.mbs)
    except InputError:                      # a switch torchtitan does not run (e.g. Megatron-Core's offloading)
        assume(False)
    value = data.draw(st.sampled_from(KNOB_VARIANTS[knob]))
    other = dataclasses.replace(plan, **{knob: value})
    a = memory.memory_terms_bytes(model, cluster(num_gpus), training, one(plan), 0)
    b = memory.memory_terms_bytes(model, cluster(num_gpus), training, one(other), 0)
    for name in memory.GRADIENT_TERMS:
        if name in a and knob not in memory.term_knobs(name, training):
            assert a[name][0] == pytest.approx(b[name][0], rel=1e-12, abs=1e-9), (name, knob)


def test_torchtitan_pipeline_accumulates_whole_gradients_and_reduces_once_a_step():
    """torch.distributed.pipelining runs each micro-batch's backward without gradient sync or resharding
    (backward_maybe_with_nosync): under torchtitan with pipeline parallelism the stage's gradients accumulate whole
    in fp32 and are reduce-scattered once after the last backward, whatever the micro-batch count. The parameters
    stay gathered after every backward too (set_reshard_after_backward(False)): ZeRO-2 ('never') keeps them whole,
    gathered once; ZeRO-3 ('always') frees them after each forward, but they are whole again from each backward to
    the next forward, beside the activations in flight."""
    from autopar.models import load_model
    from costmodels import engines
    from costmodels.evaluate import evaluate
    from costmodels.params import stage_params_per_gpu
    from costmodels.specs import Engine, LaunchPath

    model = load_model("llama-3.1-8b")
    cluster = ClusterSpec(profile=load_profile("h100-80gb"), num_gpus=16)
    plans = PlanArrays.from_plans([Plan(pp=2, zero=3), Plan(pp=1, zero=3), Plan(pp=2, zero=1), Plan(pp=2, zero=2)])
    titan = TrainingSpec(seq_len=4096, global_batch_size=32, engine=Engine.TORCHTITAN, launch=LaunchPath.EAGER)
    assert list(engines.fsdp_gradients_unsynced(titan, plans)) == [True, False, False, True]
    assert not engines.fsdp_gradients_unsynced(TrainingSpec(), plans).any()
    result = evaluate(model, cluster, titan, plans)
    terms = result.memory_terms_bytes
    dense, _ = stage_params_per_gpu(model, plans, 0)                    # the stage's layers and embedding
    assert terms["gradients"][0] + terms["embedding_gradients"][0] == pytest.approx(4 * dense[0])      # fp32, whole
    assert terms["zero_gradient_buckets"][0] == 0
    for i in (0, 3):                                                     # ZeRO-3 and ZeRO-2: whole, bf16
        assert terms["weights"][i] + terms["embedding_weights"][i] == pytest.approx(2 * dense[i])
    assert terms["zero3_prefetch_buffers"][0] == 0 and terms["weights"][1] == 0     # without PP: sharded at rest
    more = evaluate(model, cluster, dataclasses.replace(titan, global_batch_size=128), plans).time_terms_s["dp_comm"]
    assert more[3] == pytest.approx(result.time_terms_s["dp_comm"][3], rel=0.05)      # gathered and reduced once
    assert more[1] > 2 * result.time_terms_s["dp_comm"][1]                # per micro-batch without PP
