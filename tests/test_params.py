"""Parameter counts (costmodels/params.py) on the bundled presets and on hand-derived toy models.

Published totals are the model cards' / papers' figures. Where a published figure cannot be met within 1% the test
states the real tolerance and why, next to the number.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autopar.models import load_model, preset_names, spec_from_config
from costmodels.params import (
    active_params,
    embedding_params,
    mtp_module_params,
    padded_vocab_size,
    stage_params_per_gpu,
    total_params,
)
from costmodels.plan import Plan, PlanArrays
from costmodels.specs import MLASpec, MlpKind, ModelSpec, MoESpec, NormKind, PositionEmbedding

REPO = Path(__file__).resolve().parents[1]
REFERENCE = next((d for d in (REPO / "shared" / "reference", REPO.parent / "shared" / "reference") if d.is_dir()),
                 REPO.parent / "shared" / "reference")  # CI clones main beside a copy of shared/

B = 1e9

# (preset, published total, published active or None, source). Tolerance 1% unless TOLERANCE says otherwise.
PUBLISHED = [
    ("llama-3.1-8b", 8.03e9, None, "Llama 3.1 model card"),
    ("llama-3.1-70b", 70.6e9, None, "Llama 3.1 model card"),
    ("llama-3.1-405b", 405.9e9, None, "Llama 3.1 model card"),
    ("llama-2-7b", 6.74e9, None, "Llama 2 paper, 6.74B"),
    ("mistral-7b", 7.24e9, None, "Mistral 7B model card, 7.24B"),
    ("mixtral-8x7b", 46.7e9, 12.9e9, "Mixtral paper arXiv 2401.04088"),
    ("mixtral-8x22b", 141e9, 39e9, "Mixtral 8x22B announcement"),
    ("qwen2.5-7b", 7.61e9, None, "Qwen2.5-7B model card"),
    ("qwen3-8b", 8.2e9, None, "Qwen3-8B model card"),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, "Qwen3-30B-A3B model card"),
    ("qwen3-235b-a22b", 235e9, 22e9, "Qwen3-235B-A22B model card"),
    ("qwen1.5-moe-a2.7b", 14.3e9, 2.7e9, "Qwen1.5-MoE-A2.7B model card"),
    ("qwen2-57b-a14b", 57.4e9, 14.2e9, "Qwen2 report arXiv 2407.10671, Table 1: 57B total, 14B activated"),
    ("deepseek-v3", 671e9, 37e9, "DeepSeek-V3 report arXiv 2412.19437 (without MTP)"),
    ("deepseek-v2-lite", 15.7e9, None, "DeepSeek-V2 paper arXiv 2405.04434 (active: see below)"),
]

TOLERANCE = {
    # Qwen3-30B-A3B active: ours 3.353B = the sum of the HF weight shapes (embedding 0.311B + lm_head 0.311B + 48
    # layers × 56.9M). The same card's "non-embedding 29.9B" matches ours (29.91B) to 0.05%, so the card's "3.3B"
    # is 3.35B cut to two digits, not a different count: 1.6% off.
    ("qwen3-30b-a3b", "active"): 0.02,
    # DeepSeek-V3 active: ours 37.55B = embedding 0.93B + head 0.93B + 61 MLA blocks (187.1M each) + 3 dense MLPs
    # (396.4M) + 58 × (1 shared + 8 routed experts of 44.04M, router 1.8M). DeepSeek's README_WEIGHTS.md says
    # 36.7B "including 0.9B embedding and 0.9B head", exactly 58 × 7168 × 2048 (one expert matrix per MoE layer)
    # below ours, while its 671B total matches ours to 0.004%: their active tally drops one matrix per layer; the
    # report's "37B" is that 36.7B rounded. Ours is 1.5% above 37B and 2.3% above 36.7B.
    ("deepseek-v3", "active"): 0.02,
}


@pytest.mark.parametrize("name,total,active,source", PUBLISHED, ids=[row[0] for row in PUBLISHED])
def test_preset_param_counts_match_published(name: str, total: float, active: float | None, source: str) -> None:
    model = load_model(name)
    ours_total = total_params(model)
    assert ours_total == pytest.approx(total, rel=TOLERANCE.get((name, "total"), 0.01)), source
    if active is not None:
        ours_active = active_params(model)
        assert ours_active == pytest.approx(active, rel=TOLERANCE.get((name, "active"), 0.01)), source


def test_qwen3_30b_non_embedding_total_matches_card() -> None:
    # The card's second figure: 29.9B without the embedding and the (untied) output layer.
    model = load_model("qwen3-30b-a3b")
    non_embedding = total_params(model) - 2 * model.vocab_size * model.hidden_size
    assert non_embedding == pytest.approx(29.9e9, rel=0.005)


def test_deepseek_v3_active_is_the_sum_of_its_weight_shapes() -> None:
    """The 37.55B spelled out from the DeepSeek-V3 config (HF modeling_deepseek_v3.py weight shapes)."""
    model = load_model("deepseek-v3")
    h, vocab, heads = 7168, 129280, 128
    mla = (h * 1536 + 1536                     # q_a_proj + q_a_layernorm
           + 1536 * heads * (128 + 64)         # q_b_proj
           + h * (512 + 64) + 512              # kv_a_proj_with_mqa + kv_a_layernorm
           + 512 * heads * (128 + 128)         # kv_b_proj
           + heads * 128 * h)                  # o_proj
    expert = 3 * h * 2048
    dense_layer = mla + 2 * h + 3 * h * 18432
    moe_layer_active = mla + 2 * h + (1 + 8) * expert + h * 256   # shared + top-8 routed + router
    expected = 2 * vocab * h + h + 3 * dense_layer + 58 * moe_layer_active
    assert active_params(model) == expected
    assert expected == pytest.approx(37.552e9, rel=1e-4)
    # total including the MTP module: DeepSeek's README_WEIGHTS.md gives 11.5B unique MTP parameters
    assert total_params(model, include_mtp=True) - total_params(model) == pytest.approx(11.5e9, rel=0.015)


def test_deepseek_v2_lite_active_is_honestly_above_the_papers_figure() -> None:
    # The paper says 2.4B activated; the sum of the weight shapes is 2.66B (embedding and head 0.21B each), as an
    # independent count found too (github.com/deepseek-ai/DeepSeek-V2/issues/73, "a little over 2.6B", open).
    # Assert our count, not the paper's, so a change to the formula is noticed.
    assert active_params(load_model("deepseek-v2-lite")) == pytest.approx(2.661e9, rel=1e-3)


NO_REFERENCE = pytest.mark.skipif(not REFERENCE.is_dir(), reason="shared/reference is not next to this checkout")


def _reference_rows(filename: str) -> list[dict[str, str]]:
    """The rows of a published table; none when shared/reference is absent (the tests reading them are skipped)."""
    if not REFERENCE.is_dir():
        return []
    with open(REFERENCE / filename, newline="") as handle:
        return list(csv.DictReader(line for line in handle if not line.startswith("#")))


@NO_REFERENCE
def test_every_model_shape_row_has_a_matching_preset() -> None:
    for row in _reference_rows("model_shapes.csv"):
        model = load_model(row["model"].lower())
        assert model.hidden_size == int(row["hidden"]), row["model"]
        assert model.num_layers == int(row["layers"]), row["model"]
        assert model.num_attention_heads == int(row["heads"]), row["model"]
        assert model.vocab_size == int(row["vocab"]), row["model"]
        assert model.tied_embeddings == (row["tied_embeddings"] == "true"), row["model"]
        if model.mla is None:
            assert model.num_kv_heads == int(row["kv_heads"]), row["model"]
            assert model.head_dim == int(row["head_dim"]), row["model"]
        if row["experts"]:
            assert model.moe is not None
            assert model.moe.num_experts == int(row["experts"]), row["model"]
            assert model.moe.top_k == int(row["top_k"]), row["model"]
            assert model.moe.expert_ffn_hidden_size == int(row["moe_ffn"]), row["model"]
            assert model.moe.num_shared_experts == int(row["shared"]), row["model"]
            assert model.moe.first_dense_layers == int(row["first_dense_layers"]), row["model"]
        if row["ffn"]:
            assert model.ffn_hidden_size == int(row["ffn"]), row["model"]


def megatron_gpt_params(layers: int, hidden: int, vocab: int = 51200, seq: int = 2048) -> float:
    """Narayanan et al. 2021 (arXiv 2104.04473) §5.1: P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h))."""
    return 12 * layers * hidden**2 * (1 + 13 / (12 * hidden) + (vocab + seq) / (12 * layers * hidden))


@NO_REFERENCE
@pytest.mark.parametrize("row", _reference_rows("megatron_2104.04473_table1.csv"),
                         ids=lambda row: row["params_billion"])
def test_megatron_table1_gpt_presets(row: dict[str, str]) -> None:
    layers, hidden = int(row["num_layers"]), int(row["hidden_size"])
    matches = [load_model(name) for name in preset_names() if name.startswith("gpt-")]
    model = next(m for m in matches if (m.num_layers, m.hidden_size, m.vocab_size) == (layers, hidden, 51200))
    assert model.num_attention_heads == int(row["attention_heads"])
    # the paper's formula plus the final LayerNorm (2h), which it leaves out
    assert total_params(model) == pytest.approx(megatron_gpt_params(layers, hidden) + 2 * hidden, rel=1e-12)
    # the table's figure is that formula rounded to one decimal (1.652 -> "1.7"): within 0.05B, or 0.1% above 10B
    assert abs(total_params(model) / B - float(row["params_billion"])) <= max(0.05, 1e-3 * float(row["params_billion"]))


@NO_REFERENCE
@pytest.mark.parametrize("row", _reference_rows("korthikanti_2205.05198.csv"), ids=lambda row: row["model"])
def test_korthikanti_gpt_presets(row: dict[str, str]) -> None:
    model = load_model(f"gpt-{row['model'].lower()}")
    assert (model.num_layers, model.hidden_size, model.num_attention_heads) == \
        (int(row["num_layers"]), int(row["hidden_size"]), int(row["attention_heads"]))
    assert model.vocab_size == 51200 and model.tied_embeddings and model.mlp is MlpKind.PLAIN


# ---- hand-derived toy models -----------------------------------------------------------------------------------

def toy_llama() -> ModelSpec:
    return ModelSpec(name="toy-llama", hidden_size=8, num_layers=2, num_attention_heads=2, num_kv_heads=1, head_dim=4,
                     ffn_hidden_size=16, vocab_size=10)


def toy_gpt() -> ModelSpec:
    return ModelSpec(name="toy-gpt", hidden_size=8, num_layers=1, num_attention_heads=2, ffn_hidden_size=32,
                     vocab_size=10, mlp=MlpKind.PLAIN, norm=NormKind.LAYERNORM,
                     position_embedding=PositionEmbedding.LEARNED, max_position_embeddings=4, tied_embeddings=True,
                     linear_bias=True)


def toy_mixtral() -> ModelSpec:
    return ModelSpec(name="toy-mixtral", hidden_size=8, num_layers=2, num_attention_heads=2, ffn_hidden_size=16,
                     vocab_size=10, moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=16))


def toy_deepseek() -> ModelSpec:
    return ModelSpec(name="toy-deepseek", hidden_size=8, num_layers=3, num_attention_heads=2, ffn_hidden_size=12,
                     vocab_size=10,
                     moe=MoESpec(num_experts=4, top_k=1, expert_ffn_hidden_size=4, num_shared_experts=1,
                                 shared_expert_ffn_hidden_size=4, first_dense_layers=1),
                     mla=MLASpec(kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2, q_lora_rank=4),
                     num_mtp_layers=1)


def test_toy_llama_total() -> None:
    # attention: Q 8·8=64, K 8·4=32, V 32, O 64 -> 192; MLP 3·8·16 = 384; two RMSNorms 16 -> 592 per layer
    # 2 layers 1184 + embedding 10·8 = 80 + output 80 + final norm 8 = 1352
    assert total_params(toy_llama()) == 1352
    assert active_params(toy_llama()) == 1352


def test_toy_gpt_total() -> None:
    # attention: QKV 8·24 + 24 bias = 216, O 64 + 8 bias = 72 -> 288
    # MLP: 8·32 + 32 + 32·8 + 8 = 552; two LayerNorms 2·16 = 32 -> layer 872
    # word embedding 80 + positions 4·8 = 32, final LayerNorm 16, output tied (0) -> 872 + 128 = 1000
    assert total_params(toy_gpt()) == 1000


def test_toy_mixtral_total_and_active() -> None:
    # per layer: attention 4·64 = 256, norms 16, router 8·4 = 32, experts 4·3·8·16 = 1536 -> 1840; 2 layers 3680
    # + embedding 80 + output 80 + final norm 8 = 3848; active drops 2 of 4 experts: 2 layers · 768 -> 2312
    assert total_params(toy_mixtral()) == 3848
    assert active_params(toy_mixtral()) == 2312


def test_toy_deepseek_total_active_and_mtp() -> None:
    # MLA: q_a 8·4 + q norm 4, q_b 4·2·(2+2) = 32, kv_a 8·(4+2) = 48 + kv norm 4, kv_b 4·2·(2+2) = 32, o 2·2·8 = 32
    #      -> 32 + 4 + 32 + 48 + 4 + 32 + 32 = 184
    # dense layer (layer 0): 184 + norms 16 + MLP 3·8·12 = 288 -> 488
    # MoE layer: 184 + 16 + routed 4·3·8·4 = 384 + shared 3·8·4 = 96 + router 8·4 = 32 -> 712
    # total: 488 + 2·712 + embedding 80 + output 80 + final norm 8 = 2080
    model = toy_deepseek()
    assert model.num_moe_layers == 2
    assert total_params(model) == 2080
    # active: top-1 of 4 experts -> 3/4 of 384 = 288 idle per MoE layer -> 2080 - 576 = 1504
    assert active_params(model) == 1504
    # MTP module: enorm + hnorm 16, eh_proj 2·8·8 = 128, one MoE layer 712, its final norm 8 -> 864
    assert mtp_module_params(model) == 864
    assert total_params(model, include_mtp=True) == 2080 + 864


def test_padded_vocab() -> None:
    # Megatron pads to a multiple of 128·tp: 50257 -> 50304 (tp 1), 50432 (tp 2), 51200 (tp 8)
    gpt3 = load_model("gpt-3-175b")
    assert list(padded_vocab_size(gpt3, np.array([1, 2, 8]))) == [50304, 50432, 51200]


# ---- per-GPU parameters on a pipeline stage ------------------------------------------------------------------

def _stage_sums(model: ModelSpec, plan: Plan) -> tuple[float, float]:
    plans = PlanArrays.from_plans([plan])
    non_expert = expert = 0.0
    for stage in range(plan.pp):
        ne, ex = stage_params_per_gpu(model, plans, stage)
        non_expert += float(ne[0])
        expert += float(ex[0])
    return non_expert, expert


def test_toy_llama_stages_by_hand() -> None:
    # pp 2, tp 1: one 592-parameter layer per stage; vocab 10 pads to 128 -> embedding 128·8 = 1024 on stage 0,
    # output 1024 and the final norm 8 on stage 1
    plans = PlanArrays.from_plans([Plan(pp=2)])
    assert stage_params_per_gpu(toy_llama(), plans, 0)[0][0] == 592 + 1024
    assert stage_params_per_gpu(toy_llama(), plans, 1)[0][0] == 592 + 1024 + 8


@pytest.mark.parametrize("name", ["llama-3.1-70b", "llama-2-7b", "qwen2.5-7b", "gpt-22b"])
@pytest.mark.parametrize("pp", [1, 2, 4])
def test_dense_stages_sum_to_total_at_tp1(name: str, pp: int) -> None:
    model = load_model(name)
    non_expert, expert = _stage_sums(model, Plan(pp=pp))
    padding = (int(padded_vocab_size(model, 1)) - model.vocab_size) * model.hidden_size
    copies = 1 if model.tied_embeddings else 2            # embedding and output, each padded
    tied_copy = model.vocab_size * model.hidden_size + padding if (model.tied_embeddings and pp > 1) else 0
    assert expert == 0
    assert non_expert == pytest.approx(total_params(model) + copies * padding + tied_copy, rel=1e-12)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallel_stages_hold_a_tp_th_plus_replicated(tp: int) -> None:
    # tp-way sharding: everything but the norms splits, so tp·(per-GPU) = total + (tp-1)·norms (+ vocab padding)
    model = load_model("llama-3.1-8b")
    non_expert, _ = _stage_sums(model, Plan(tp=tp))
    norms = (2 * model.num_layers + 1) * model.hidden_size
    padding = 2 * (int(padded_vocab_size(model, tp)) - model.vocab_size) * model.hidden_size
    assert non_expert * tp == pytest.approx(total_params(model) + (tp - 1) * norms + padding, rel=1e-12)


def test_tied_embedding_held_on_both_ends_only_with_pipeline() -> None:
    # toy GPT, vocab 10 padded to 128: word embedding 128·8 = 1024, positions 4·8 = 32, final LayerNorm 16
    model = toy_gpt()
    one_stage = PlanArrays.from_plans([Plan(pp=1)])
    assert stage_params_per_gpu(model, one_stage, 0)[0][0] == 872 + 1024 + 32 + 16   # embedding once
    two = dataclasses.replace(toy_gpt(), num_layers=2)
    plans = PlanArrays.from_plans([Plan(pp=2)])
    assert stage_params_per_gpu(two, plans, 0)[0][0] == 872 + 1024 + 32                # embedding + positions
    assert stage_params_per_gpu(two, plans, 1)[0][0] == 872 + 1024 + 16                # tied copy + final norm


def test_moe_stages_split_experts_over_ep() -> None:
    model = load_model("mixtral-8x7b")
    for ep in (1, 2, 4, 8):
        non_expert, expert = _stage_sums(model, Plan(pp=2, ep=ep, etp=1))
        all_experts = model.num_layers * 8 * 3 * 4096 * 14336
        assert expert * ep == pytest.approx(all_experts, rel=1e-12)
        assert non_expert + expert * ep == pytest.approx(total_params(model), rel=1e-12)  # vocab 32000 = 250·128


def test_deepseek_mtp_lives_on_the_last_stage() -> None:
    model = load_model("deepseek-v3")
    plans = PlanArrays.from_plans([Plan(pp=4, ep=8, etp=1, first_stage_layers=16, last_stage_layers=15)])
    last_ne, last_ex = stage_params_per_gpu(model, plans, 3)
    without = dataclasses.replace(model, num_mtp_layers=0)
    base_ne, base_ex = stage_params_per_gpu(without, plans, 3)
    mtp_expert = 256 * 3 * 7168 * 2048
    assert last_ex[0] - base_ex[0] == pytest.approx(mtp_expert / 8, rel=1e-12)
    assert last_ne[0] - base_ne[0] == pytest.approx(mtp_module_params(model) - mtp_expert, rel=1e-12)
    assert stage_params_per_gpu(model, plans, 0)[1][0] == stage_params_per_gpu(without, plans, 0)[1][0]


def test_embedding_params_counts_learned_positions() -> None:
    # GPT-3 175B: word 50257·12288 + positions 2048·12288
    assert embedding_params(load_model("gpt-3-175b")) == (50257 + 2048) * 12288
    assert embedding_params(load_model("llama-3.1-8b")) == 128256 * 4096


# ---- properties ------------------------------------------------------------------------------------------------


@st.composite
def llama_configs(draw: st.DrawFn) -> dict:
    """Random Llama-style config.json contents (GQA, explicit head_dim, tied or not)."""
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 4]))
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
            "hidden_size": draw(st.integers(1, 64)) * 8, "num_hidden_layers": draw(st.integers(1, 48)),
            "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": draw(st.sampled_from([16, 32, 64, 128])), "intermediate_size": draw(st.integers(1, 4096)),
            "vocab_size": draw(st.integers(1, 200_000)), "tie_word_embeddings": draw(st.booleans())}


@given(llama_configs())
def test_llama_config_total_is_the_closed_form(config: dict) -> None:
    model = spec_from_config(config, name="random", source="hypothesis")
    h, layers, a, g, d = (config[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                              "num_key_value_heads", "head_dim"))
    ffn, vocab = config["intermediate_size"], config["vocab_size"]
    per_layer = 2 * h * a * d + 2 * h * g * d + 3 * h * ffn + 2 * h      # Q,O + K,V + SwiGLU + two RMSNorms
    embeddings = vocab * h * (1 if config["tie_word_embeddings"] else 2)
    assert total_params(model) == layers * per_layer + embeddings + h


@given(llama_configs(), st.sampled_from([1, 2, 3, 4, 8]))
def test_stages_partition_the_model_at_tp1(config: dict, pp: int) -> None:
    config = dict(config, num_hidden_layers=pp * max(1, config["num_hidden_layers"] // pp))
    model = spec_from_config(config, name="random", source="hypothesis")
    non_expert, _ = _stage_sums(model, Plan(pp=pp))
    padded_rows = int(padded_vocab_size(model, 1)) - model.vocab_size
    # every layer on exactly one stage; embedding (padded) on the first, output (padded) and final norm on the
    # last; a tied embedding is held once with pp = 1 and on both ends with pp > 1 (Megatron)
    copies = 2 if (not model.tied_embeddings or pp > 1) else 1
    untied_extra = 0 if not model.tied_embeddings else (copies - 1) * model.vocab_size * model.hidden_size
    assert non_expert == pytest.approx(total_params(model) + copies * padded_rows * model.hidden_size
                                       + untied_extra, rel=1e-12)
