"""Parameter counts: per layer from the model shape, whole-model totals, and per-GPU counts on a pipeline stage.

Shapes follow the Hugging Face / Megatron-Core implementations:
- GQA attention: Q and O are h·(a·d), K and V are h·(g·d) (Ainslie et al., arXiv 2305.13245).
- MLA: down projections h·q_lora and h·(kv_lora + d_rope), up projections to a·(d_nope + d_rope) and a·(d_nope + d_v),
  output a·d_v·h, plus the two latent norms (DeepSeek-V2, arXiv 2405.04434 §2.1; HF modeling_deepseek_v3.py).
- MLP: gated 3·h·F, plain 2·h·F (+ biases F + h when linear_bias).
- MoE: E routed experts of 3·h·F_e, shared experts, router h·E (DeepSeekMoE arXiv 2401.06066; Mixtral arXiv 2401.04088).
- Megatron TP (arXiv 1909.08053): column/row-parallel weights split over tp; norms and the router are replicated;
  MLA down projections are replicated in Megatron-Core (`linear_q_down_proj`, `linear_kv_down_proj`).
- Vocabulary padded to a multiple of 128·tp (Megatron --make-vocab-size-divisible-by 128, times tp).
"""

from __future__ import annotations

import numpy as np

from costmodels.plan import PlanArrays, StageContent, first_layer_index, layers_on_stage
from costmodels.specs import MlpKind, ModelSpec, NormKind, PositionEmbedding
from costmodels.structure import per_structure

VOCAB_PAD_MULTIPLE = 128  # Megatron --make-vocab-size-divisible-by default


# ---- per layer -------------------------------------------------------------------------------------------------

def norm_params(model: ModelSpec) -> int:
    """One normalisation layer: h (RMSNorm) or 2h (LayerNorm with bias)."""
    return model.hidden_size * (2 if model.norm is NormKind.LAYERNORM else 1)


def attention_params_split(model: ModelSpec) -> tuple[int, int]:
    """(TP-sharded, TP-replicated) attention parameters of one layer, excluding the pre-attention norm."""
    h = model.hidden_size
    if model.mla is not None:
        mla = model.mla
        a = model.num_attention_heads
        replicated = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank  # kv down-proj + kv norm
        sharded = mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim)      # kv up-proj
        if mla.q_lora_rank:
            replicated += h * mla.q_lora_rank + mla.q_lora_rank                         # q down-proj + q norm
            sharded += mla.q_lora_rank * a * mla.qk_head_dim                            # q up-proj
        else:
            sharded += h * a * mla.qk_head_dim                                          # q proj
        sharded += a * mla.v_head_dim * h                                               # output proj
        if model.linear_bias:
            replicated += h
        return sharded, replicated
    q, kv = model.q_size, model.kv_size
    sharded = h * q + 2 * h * kv + q * h                                                # Q, K, V, O
    if model.qkv_bias or model.linear_bias:
        sharded += q + 2 * kv
    replicated = h if model.linear_bias else 0                                          # O bias (row-parallel)
    return sharded, replicated


def mlp_params(model: ModelSpec, width: int) -> int:
    """A dense MLP of intermediate size `width` (TP-sharded)."""
    h = model.hidden_size
    matrices = 3 if model.mlp is MlpKind.GATED else 2
    bias = (width * (matrices - 1) + h) if model.linear_bias else 0
    return matrices * h * width + bias


def routed_expert_params(model: ModelSpec) -> int:
    """All routed experts of one MoE layer (sharded over ep·etp)."""
    assert model.moe is not None
    return model.moe.num_experts * mlp_params(model, model.moe.expert_ffn_hidden_size)


def moe_shared_params_split(model: ModelSpec) -> tuple[int, int]:
    """(TP-sharded shared experts, TP-replicated router and gates) of one MoE layer."""
    assert model.moe is not None
    moe = model.moe
    shared = mlp_params(model, moe.shared_expert_ffn_hidden_size) if moe.num_shared_experts else 0
    router = model.hidden_size * moe.num_experts + (model.hidden_size if moe.shared_expert_gate else 0)
    return shared, router


def embedding_params(model: ModelSpec, vocab_size: int | None = None) -> int:
    """Word embedding (V·h) plus a learned position table when the model has one."""
    vocab = model.vocab_size if vocab_size is None else vocab_size
    position = model.max_position_embeddings * model.hidden_size \
        if model.position_embedding is PositionEmbedding.LEARNED else 0
    return vocab * model.hidden_size + position


def mtp_module_params(model: ModelSpec) -> int:
    """One DeepSeek-V3 MTP module, embedding and head shared: enorm + hnorm + eh_proj (2h·h) + a decoder layer +
    its final norm (HF modeling_deepseek_v3.py, DeepSeek-V3 report §2.2)."""
    h = model.hidden_size
    return 2 * norm_params(model) + 2 * h * h + layer_params(model, moe_layer=model.is_moe) + norm_params(model)


def layer_params(model: ModelSpec, moe_layer: bool) -> int:
    """All parameters of one decoder layer (both norms included)."""
    attn_sharded, attn_replicated = attention_params_split(model)
    total = attn_sharded + attn_replicated + 2 * norm_params(model)
    if moe_layer:
        shared, router = moe_shared_params_split(model)
        total += routed_expert_params(model) + shared + router
    else:
        total += mlp_params(model, model.ffn_hidden_size)
    return total


# ---- whole model -----------------------------------------------------------------------------------------------

def total_params(model: ModelSpec, include_mtp: bool = False) -> int:
    """Unique parameters (unpadded vocabulary; tied embeddings counted once)."""
    total = embedding_params(model) + norm_params(model)                                 # + final norm
    if not model.tied_embeddings:
        total += model.vocab_size * model.hidden_size                                    # output layer
    if model.is_moe:
        total += model.num_moe_layers * layer_params(model, moe_layer=True)
    total += model.num_dense_layers * layer_params(model, moe_layer=False)
    if include_mtp:
        total += model.num_mtp_layers * mtp_module_params(model)
    return total


def active_params(model: ModelSpec, include_mtp: bool = False) -> int:
    """Parameters touched by one token: the routed experts count top_k / E of their total."""
    total = total_params(model, include_mtp)
    if model.moe is None:
        return total
    inactive_fraction = 1.0 - model.moe.top_k / model.moe.num_experts
    moe_layers = model.num_moe_layers + (model.num_mtp_layers if include_mtp else 0)
    return int(round(total - moe_layers * routed_expert_params(model) * inactive_fraction))


def padded_vocab_size(model: ModelSpec, tp: "np.ndarray | int") -> np.ndarray:
    """Megatron pads the vocabulary to a multiple of 128·tp."""
    multiple = VOCAB_PAD_MULTIPLE * np.asarray(tp, dtype=np.int64)
    return -(-model.vocab_size // multiple) * multiple


# ---- per GPU on a pipeline stage (vectorised) ------------------------------------------------------------------

def moe_layers_before(model: ModelSpec, layer_index: np.ndarray) -> np.ndarray:
    """Number of MoE layers among decoder layers [0, layer_index) (closed form of ModelSpec.is_moe_layer)."""
    if model.moe is None:
        return np.zeros_like(np.asarray(layer_index, dtype=float))
    k, freq = model.moe.first_dense_layers, model.moe.layer_freq
    upto = np.clip(np.asarray(layer_index, dtype=float), 0, model.num_layers)
    # layer i >= k is MoE iff (i + 1) % freq == 0: count multiples of freq in (k, upto]
    return np.maximum(np.floor(upto / freq) - np.floor(k / freq), 0)


def layout_stage_layers(model: ModelSpec, layout: "tuple[float, ...]") -> tuple[np.ndarray, np.ndarray]:
    """(decoder layers, MoE layers) of every virtual stage of `layout` (decoder layers per virtual stage in model
    order, costmodels.layout), the MoE layers by ModelSpec.is_moe_layer's closed form (`moe_layers_before`)."""
    bounds = np.concatenate(([0.0], np.cumsum(np.asarray(layout, dtype=float))))
    moe = np.diff(moe_layers_before(model, bounds))
    return np.asarray(layout, dtype=float), moe


def layout_rank_content(model: ModelSpec, layout: "tuple[float, ...]", pp: int) -> StageContent:
    """Every pipeline rank (0..pp-1) of `layout` with its decoder and MoE layers, all its virtual stages together
    (virtual stage i runs on rank i % pp: Megatron-Core's PipelineParallelLayerLayout), and each chunk's layers."""
    layers, moe = layout_stage_layers(model, layout)
    return StageContent.of(np.arange(pp), np.array([layers[r::pp].sum() for r in range(pp)]),
                           np.array([moe[r::pp].sum() for r in range(pp)]),
                           np.array([layers[r::pp] for r in range(pp)]))


def moe_layers_on_stage(model: ModelSpec, plans: PlanArrays, stage: "np.ndarray | int") -> np.ndarray:
    """MoE layers among the decoder layers of pipeline rank `stage` (contiguous assignment, or as a
    costmodels.plan.StageContent says)."""
    if isinstance(stage, StageContent) and stage.moe_layers is not None:
        return np.asarray(stage.moe_layers)
    return per_structure(plans, ("moe_layers_on_stage", id(model)), lambda p, s: _moe_layers_on_stage(model, p, s),
                         stage)


def _moe_layers_on_stage(model: ModelSpec, plans: PlanArrays, stage: "np.ndarray | int") -> np.ndarray:
    start = first_layer_index(model.num_layers, plans, stage)
    count = layers_on_stage(model.num_layers, plans, stage)
    return moe_layers_before(model, start + count) - moe_layers_before(model, start)


def stage_embedding_params_per_gpu(model: ModelSpec, plans: PlanArrays, stage: "np.ndarray | int") -> np.ndarray:
    """Word embedding (vocab-parallel, /tp) and learned positions on the first rank; output layer and final norm on
    the last. A tied embedding is held once when pp = 1 and on both ends when pp > 1, as Megatron does."""
    return per_structure(plans, ("stage_embedding_params_per_gpu", id(model)),
                         lambda p, s: _stage_embedding_params_per_gpu(model, p, s), stage)


def _stage_embedding_params_per_gpu(model: ModelSpec, plans: PlanArrays, stage: "np.ndarray | int") -> np.ndarray:
    stage = np.broadcast_to(np.asarray(stage, dtype=np.int64), (len(plans),))
    word_embedding = padded_vocab_size(model, plans.tp) * model.hidden_size / plans.tp.astype(float)
    position = embedding_params(model, vocab_size=0)                                    # replicated table
    is_first = stage == 0
    is_last = stage == plans.pp - 1
    holds_output = is_last & ((plans.pp > 1) | (not model.tied_embeddings))
    return (np.where(is_first, word_embedding + position, 0.0) + np.where(holds_output, word_embedding, 0.0)
            + np.where(is_last, norm_params(model), 0.0))


def stage_params_per_gpu(model: ModelSpec, plans: PlanArrays, stage: "np.ndarray | int"
                         ) -> tuple[np.ndarray, np.ndarray]:
    """(non-expert, expert) parameters held by one GPU of pipeline rank `stage`.

    Non-expert: TP-sharded weights / tp + replicated ones (norms, router, MLA down projections), plus the embedding
    on the first stage and the output layer and final norm on the last (both when pp = 1; a tied embedding is held
    once when pp = 1 and on both ends when pp > 1, as Megatron does). Expert: routed experts / (ep·etp).
    """
    return per_structure(plans, ("stage_params_per_gpu", id(model)),
                         lambda p, s: _stage_params_per_gpu(model, p, s), stage)


def _stage_params_per_gpu(model: ModelSpec, plans: PlanArrays, stage: "np.ndarray | int"
                          ) -> tuple[np.ndarray, np.ndarray]:
    layers = layers_on_stage(model.num_layers, plans, stage)
    moe_layers = moe_layers_on_stage(model, plans, stage)
    stage = np.broadcast_to(np.asarray(stage, dtype=np.int64), (len(plans),))
    tp = plans.tp.astype(float)
    dense_layers = layers - moe_layers

    attn_sharded, attn_replicated = attention_params_split(model)
    per_layer = (attn_sharded / tp + attn_replicated + 2 * norm_params(model))
    non_expert = layers * per_layer + dense_layers * mlp_params(model, model.ffn_hidden_size) / tp
    expert = np.zeros(len(plans))
    if model.moe is not None:
        shared, router = moe_shared_params_split(model)
        non_expert = non_expert + moe_layers * (shared / tp + router)
        expert = moe_layers * routed_expert_params(model) / (plans.ep * plans.etp)

    non_expert = non_expert + stage_embedding_params_per_gpu(model, plans, stage)
    is_last = stage == plans.pp - 1
    if model.num_mtp_layers:
        mtp = model.num_mtp_layers * mtp_module_params(model)
        mtp_expert = model.num_mtp_layers * routed_expert_params(model) if model.is_moe else 0
        # MTP modules live on the last stage (Megatron-Core); their experts shard like the others
        non_expert = non_expert + np.where(is_last, (mtp - mtp_expert) / tp, 0.0)
        expert = expert + np.where(is_last, mtp_expert / (plans.ep * plans.etp), 0.0)
    return non_expert, expert
